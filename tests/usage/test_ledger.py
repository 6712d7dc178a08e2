"""The usage ledger through the real ingest: signed snapshots of two hosts (one with a MIG GPU), holders
appearing, idling and exiting, checked against figures worked out by hand, to the millisecond."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from gpuadmin.usage import ledger
from gpuadmin.usage.models import LifeUsage, UsageCursor, UsageDay
from tests.factories import GiB, gpu, proc, slurm_owner, snapshot
from tests.fleet.helpers import at
from tests.keys import deliver

pytestmark = pytest.mark.django_db

MiB = 2**20
GPU0, GPU1, MIG_PARENT = "GPU-sim-0000", "GPU-sim-0001", "GPU-mig-0000"
MIG_A, MIG_B = "MIG-aaaa", "MIG-bbbb"


def alice(memory: int = 2 * GiB) -> dict[str, Any]:
    return proc(100, user="alice", uid=1000, gpu_memory={GPU0: memory}, reasons=["gpu"])


def bob(gpu1: int = GiB) -> dict[str, Any]:
    return proc(200, user="bob", uid=1001, gpu_memory={GPU0: 4 * GiB, GPU1: gpu1}, reasons=["gpu"],
                owner=slurm_owner("77", uid=1001))


def host_a(seconds: float, processes: list[dict[str, Any]], util0: int | None, util1: int | None = 0) -> None:
    document = snapshot("gpu-a", processes=processes, taken_at=at(seconds),
                        gpus=[gpu(0, utilization_percent=util0, name="Sim H100"),
                              gpu(1, utilization_percent=util1, name="Sim H100")])
    deliver(document, received_at=at(seconds + 1))


def on_mig(pid: int, user: str, gi: int, memory: int) -> dict[str, Any]:
    return proc(pid, user=user, uid=2000 + pid, gpu_memory={MIG_PARENT: memory}, reasons=["gpu"],
                mig_instances=[{"gpu_uuid": MIG_PARENT, "gpu_instance_id": gi, "compute_instance_id": 0,
                                "used_memory_bytes": memory}])


def host_b(seconds: float, processes: list[dict[str, Any]]) -> None:
    parent = gpu(0, uuid=MIG_PARENT, utilization_percent=None, name="Sim A100")
    parent["mig_instances"] = [
        {"uuid": MIG_A, "name": "Sim A100 MIG 3g.20gb", "gpu_instance_id": 1, "compute_instance_id": 0,
         "memory_total_bytes": 20 * GiB, "memory_used_bytes": 3 * GiB},
        {"uuid": MIG_B, "name": "Sim A100 MIG 1g.5gb", "gpu_instance_id": 2, "compute_instance_id": 0,
         "memory_total_bytes": 5 * GiB, "memory_used_bytes": GiB},
    ]
    deliver(snapshot("gpu-b", processes=processes, taken_at=at(seconds), gpus=[parent]),
            received_at=at(seconds + 1))


def timeline() -> None:
    """Probe interval 10 s, so a gap counts up to 30 s (ledger.GAP_CAP_INTERVALS)."""
    # gpu-a. t=0: alice alone on GPU0 (50 %); bob's 100 MiB on GPU1 is under the threshold.
    host_a(0, [alice(), proc(200, user="bob", uid=1001, gpu_memory={GPU1: 100 * MiB})], util0=50)
    host_b(5, [on_mig(300, "carol", 1, 3 * GiB)])
    # t=10: bob (a new life: another start) joins GPU0 (80 %, two holders) and holds GPU1 at 0 %.
    host_a(10, [alice(), bob()], util0=80)
    host_b(15, [on_mig(300, "carol", 1, 3 * GiB), on_mig(400, "dave", 2, GiB)])
    # t=20: both idle on GPU0.
    host_a(20, [alice(), bob()], util0=0)
    host_b(25, [on_mig(300, "carol", 1, 3 * GiB)])  # dave exited
    # t=80: the agent was silent for 60 s: 30 s of it count. bob exited; alice computes at 30 %.
    host_a(80, [alice()], util0=30)
    # t=90: alice freed her memory.
    host_a(90, [alice(memory=0)], util0=0)


def life(pid: int, device: str) -> tuple[int, ...]:
    row = LifeUsage.objects.get(pid=pid, device_uuid=device)
    return (row.held_milliseconds, row.held_byte_seconds, row.busy_milliseconds, row.idle_milliseconds,
            row.unmeasured_milliseconds)


def seconds(held: int, memory: int, busy: int = 0, idle: int = 0, unmeasured: int = 0) -> tuple[int, ...]:
    return (held * 1000, memory * held, busy * 1000, idle * 1000, unmeasured * 1000)


@pytest.mark.parametrize("flush_seconds", [0, 3600])
def test_a_timeline_on_two_hosts_and_a_mig_gpu_gives_the_hand_worked_figures(settings, flush_seconds) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = flush_seconds
    timeline()
    if flush_seconds:
        assert not LifeUsage.objects.exists()  # still in the cursors
        assert ledger.flush_all() == 2
        assert set(UsageCursor.objects.values_list("pending", flat=True)) == {"[]"}
    # alice, GPU0: [0,10) 50 % alone: 5 s busy; [10,20) 80 % shared by two: 4 s; [20,80) idle, capped
    # at 30 s; [80,90) 30 % alone: 3 s. Held 60 s at 2 GiB.
    assert life(100, GPU0) == seconds(60, 2 * GiB, busy=12, idle=30)
    # bob from t=10: GPU0 [10,20) 4 s busy, [20,50) idle; GPU1 at 0 % throughout: 40 s idle.
    assert life(200, GPU0) == seconds(40, 4 * GiB, busy=4, idle=30)
    assert life(200, GPU1) == seconds(40, GiB, idle=40)
    # MIG instances: devices of their own, no utilisation (unmeasured). carol [5,25) until the last
    # snapshot; dave from 15 until his exit at 25.
    assert life(300, MIG_A) == seconds(20, 3 * GiB, unmeasured=20)
    assert life(400, MIG_B) == seconds(10, GiB, unmeasured=10)
    assert not LifeUsage.objects.filter(device_uuid=MIG_PARENT).exists()
    carol = LifeUsage.objects.get(pid=300)
    assert (carol.device_model, carol.first_at, carol.last_at) == ("Sim A100 MIG 3g.20gb", at(5), at(25))


def test_settling_goes_a_batch_of_hosts_at_a_time_and_passes_over_cursors_with_nothing_to_settle(
    settings
) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 3600
    timeline()
    assert ledger.flush_all(hosts_per_batch=1) == 2
    assert life(100, GPU0) == seconds(60, 2 * GiB, busy=12, idle=30)  # as settled one by one
    assert life(300, MIG_A) == seconds(20, 3 * GiB, unmeasured=20)
    with CaptureQueriesContext(connection) as queries:
        assert ledger.flush_all() == 0
    # Both hosts silent since: their cursors were listed, neither locked nor read.
    assert len(queries.captured_queries) == 1, queries.captured_queries
    assert "FOR UPDATE" not in queries.captured_queries[0]["sql"]
    assert LifeUsage.objects.count() == 5  # bob's 100 MiB at t=0 held nothing

    days = {(d.host.name, d.user, d.owner_label, d.device_model): (d.held_milliseconds, d.idle_milliseconds)
            for d in UsageDay.objects.select_related("host")}
    assert days == {
        ("gpu-a", "alice", "", "Sim H100"): (60_000, 30_000),
        ("gpu-a", "bob", "job 77.0", "Sim H100"): (80_000, 70_000),
        ("gpu-b", "carol", "", "Sim A100 MIG 3g.20gb"): (20_000, 0),
        ("gpu-b", "dave", "", "Sim A100 MIG 1g.5gb"): (10_000, 0),
    }
    bob_day = UsageDay.objects.get(user="bob")
    assert (bob_day.uid, bob_day.owner_kind, bob_day.owner_uid) == (1001, "slurm_job", 1001)
    # No process carried its own utilisation: every busy millisecond is the shared estimate.
    for row in [*LifeUsage.objects.all(), *UsageDay.objects.all()]:
        assert row.busy_estimated_milliseconds == row.busy_milliseconds


def busy(pid: int, device: str) -> tuple[int, int]:
    row = LifeUsage.objects.get(pid=pid, device_uuid=device)
    return row.busy_milliseconds, row.busy_estimated_milliseconds


@pytest.mark.parametrize("flush_seconds", [0, 3600])
def test_measured_utilisation_is_each_holder_s_own_and_the_rest_of_the_device_is_shared(
        settings, flush_seconds) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = flush_seconds

    def measured(process: dict[str, Any], **percent: int) -> dict[str, Any]:
        return {**process, "gpu_utilization_percent": {GPU0 if k == "gpu0" else GPU1: v
                                                      for k, v in percent.items()}}

    carol = proc(50, user="carol", uid=1002, gpu_memory={GPU0: GiB}, reasons=["gpu"])
    # t=0: GPU0 at 70 %, alice measured at 40 %, bob without a figure there: bob's estimate is what
    # alice left, 30 %. GPU1: bob measured at 25 %.
    host_a(0, [measured(alice(), gpu0=40), measured(bob(), gpu1=25)], util0=70, util1=25)
    # t=10: both measured on GPU0 (90 %: 60 and 20; the 10 % nobody measured is nobody's); GPU1 50 %.
    host_a(10, [measured(alice(), gpu0=60), measured(bob(), gpu0=20, gpu1=50)], util0=90, util1=50)
    # t=20: carol (pid 50: first in the holders' list) joins GPU0 without a figure, and alice's is
    # gone: GPU0 at 50 %, bob measured at 10 %, the 40 % left shared by alice and carol, 20 % each.
    host_a(20, [carol, alice(), measured(bob(), gpu0=10, gpu1=50)], util0=50, util1=50)
    host_a(30, [carol, alice(), measured(bob(), gpu0=10, gpu1=50)], util0=50, util1=50)
    if flush_seconds:
        ledger.flush_all()

    # alice: 4 s + 6 s measured, then 2 s estimated.
    assert busy(100, GPU0) == (12_000, 2_000)
    # bob on GPU0: 3 s estimated, then 2 s + 1 s measured; on GPU1 all measured: 2.5 + 5 + 5 s.
    assert busy(200, GPU0) == (6_000, 3_000)
    assert busy(200, GPU1) == (12_500, 0)
    assert busy(50, GPU0) == (2_000, 2_000)
    assert life(200, GPU1) == (30_000, 30 * GiB, 12_500, 0, 0)
    days = {d.user: (d.busy_milliseconds, d.busy_estimated_milliseconds) for d in UsageDay.objects.all()}
    assert days == {"alice": (12_000, 2_000), "bob": (18_500, 3_000), "carol": (2_000, 2_000)}


def test_the_probe_s_own_figures_from_simulated_gpus_reach_the_ledger_as_measured(settings, tmp_path) -> None:
    """What `make demo` shows: the real probe's snapshot of this machine, a simulated GPU held by this
    test's own process at 30 % of the GPU's 90 %."""
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({
        "gpus": [{"uuid": GPU0, "name": "Sim H100", "memory_total_bytes": 80 * GiB,
                  "utilization_percent": 90}],
        "processes": [{"pid": os.getpid(), "gpu_uuid": GPU0, "used_memory_bytes": 2 * GiB,
                       "utilization_percent": 30}]}))
    document = take_snapshot(ProbeConfig(gpu_backend="simulated", simulated_gpus_path=str(gpus),
                                         device_glob=str(tmp_path / "no-device*"), host_name="real-host"))
    taken_at = datetime.fromisoformat(document["taken_at"])
    deliver(document, received_at=taken_at + timedelta(seconds=1))
    later = taken_at + timedelta(seconds=10)
    deliver({**document, "taken_at": later.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
            received_at=later + timedelta(seconds=1))
    assert busy(os.getpid(), GPU0) == (3_000, 0)


def test_figures_settled_before_busy_was_measured_count_as_estimated(settings) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 3600
    host_a(0, [alice()], util0=50)
    host_a(10, [bob()], util0=50)  # alice gone: her figures wait in the cursor's pending list
    cursor = UsageCursor.objects.get()
    pending = json.loads(cursor.pending)
    pending[0][2] = pending[0][2][:5]  # as a cursor written before the estimated counter was kept
    UsageCursor.objects.filter(pk=cursor.pk).update(pending=json.dumps(pending))
    ledger.flush_all()
    assert busy(100, GPU0) == (5_000, 5_000)


def test_an_interval_across_midnight_is_split_between_the_days(settings) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    midnight = datetime(2026, 12, 3, tzinfo=UTC)
    for offset in (-4, 6):
        taken = midnight + timedelta(seconds=offset)
        deliver(snapshot("gpu-a", processes=[alice()], taken_at=taken,
                         gpus=[gpu(0, utilization_percent=0)]), received_at=taken + timedelta(seconds=1))
    assert dict(UsageDay.objects.values_list("day", "held_milliseconds")) == {
        midnight.date() - timedelta(days=1): 4000, midnight.date(): 6000}
    assert life(100, GPU0)[0] == 10_000


def test_the_ledger_off_keeps_nothing(settings) -> None:
    settings.GPUADMIN_USAGE_LEDGER = False
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    host_a(0, [alice()], util0=50)
    host_a(10, [alice()], util0=50)
    assert not UsageCursor.objects.exists()
    assert not LifeUsage.objects.exists()


def test_a_late_snapshot_charges_nothing_twice(settings) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    host_a(0, [alice()], util0=50)
    host_a(10, [alice()], util0=50)
    host_a(5, [alice()], util0=50)  # late: history only (ingest), nothing for the ledger
    host_a(10, [alice()], util0=50)  # redelivered
    assert life(100, GPU0)[0] == 10_000
