"""A policy's dry run over the week's stored history, through each tier it is kept in: real snapshots
ingested (signed, through receive_snapshot, so raw samples are change-coded as ingest writes them), then
the real periodic history task (``retention.maintain_history``) rolls them up and prunes them, as a week
of it would have. A week-old idle run is found in the 30-minute rollups, a day-and-a-half-old one in
the 5-minute ones, a run across the rollups' end into the raw samples is one run, and a run busy for a
moment partway is not one; raw samples a minute apart hold until the next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.fairuse import dry_run
from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.history import retention
from gpuadmin.fleet.models import GpuRollup, GpuRollupCoarse, GpuSample, Host
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0)
GPU0 = "GPU-sim-0000"
PIDS = {"gpu01": 4120, "gpu02": 5120}


def send(host: str, taken_at: datetime, *, utilization: int = 0) -> None:
    """One snapshot of ``host``: its one GPU at ``utilization`` with 10 GiB held by its notebook."""
    holder = proc(PIDS[host], uid=1000, user="alice", name="python", cmdline=["python", "notebook.py"],
                  gpu_memory={GPU0: 10 * GiB})
    deliver(snapshot(host, taken_at=taken_at, processes=[holder],
                     gpus=[gpu(0, used=10 * GiB, utilization_percent=utilization)]),
            received_at=taken_at)


def keep_history(now: datetime) -> None:
    """Run the periodic history task at ``now`` until it has caught up (it rolls up a day a run)."""
    for _ in range(30):
        marks = list(Host.objects.values_list("history_rolled_up_until", "history_coarse_rolled_up_until"))
        retention.maintain_history(now)
        if list(Host.objects.values_list("history_rolled_up_until",
                                         "history_coarse_rolled_up_until")) == marks:
            return
    raise AssertionError("history never caught up")


def idle_policy(minutes: int = 60) -> Policy:
    return Policy.objects.create(name="idle notebooks", condition=Policy.Condition.IDLE_HOLDER,
                                 mode=Policy.Mode.DRY_RUN, minutes=minutes, notify_again_after_minutes=30,
                                 request_after_minutes=30)


@pytest.mark.parametrize(("age", "past_half_hour"), [(timedelta(days=6), timedelta(0)),
                                                     (timedelta(hours=36), timedelta(minutes=5))],
                         ids=["30-minute", "5-minute"])
def test_an_old_idle_run_is_found_in_its_rollups_and_one_busy_a_moment_partway_is_not(age, past_half_hour):
    # Whole buckets of the tier under test; the 5-minute one's run starts 5 minutes into a half hour,
    # which the 30-minute rollups would place at the half hour.
    base = retention.coarse_bucket_start(retention.coarse_bucket_of(NOW - age)) + past_half_hour
    for minute in range(91):  # a snapshot written a minute apart (the heartbeat), both GPUs idle, held
        taken_at = base + timedelta(minutes=minute)
        send("gpu01", taken_at)
        if minute == 45:  # gpu02 computes at 1% for one probe: a mean over its bucket rounds it to 0
            send("gpu02", taken_at, utilization=1)
            send("gpu02", taken_at + timedelta(seconds=10))
        else:
            send("gpu02", taken_at)
    for host in PIDS:
        send(host, base + timedelta(minutes=91), utilization=80)
    keep_history(NOW)
    # Only the tier under test holds that day now.
    assert not GpuSample.objects.filter(taken_at__lt=NOW - timedelta(days=1)).exists()
    fine = GpuRollup.objects.filter(bucket__lt=retention.bucket_of(base + timedelta(hours=2)))
    assert fine.exists() == (age < timedelta(days=2))
    assert GpuRollupCoarse.objects.filter(gpu__host__name="gpu02", utilization_max_percent=1).exists()

    (would,) = dry_run.would_have(idle_policy(), NOW)
    assert (would.host_name, would.pid, would.since) == ("gpu01", 4120, base)
    assert would.notified_at == base + timedelta(minutes=60)
    assert would.reminded_at == base + timedelta(minutes=90) and would.requested_at is None


def test_a_run_from_the_rollups_into_the_raw_samples_is_one_run():
    raw_from = retention.bucket_start(retention.bucket_of(retention.raw_kept_since(NOW)) + 1)
    start = raw_from - timedelta(minutes=30)
    for minute in range(60):
        send("gpu01", start + timedelta(minutes=minute))
    send("gpu01", start + timedelta(minutes=60), utilization=80)
    keep_history(NOW)
    assert not GpuSample.objects.filter(taken_at__lt=start + timedelta(minutes=20)).exists()

    (would,) = dry_run.would_have(idle_policy(), NOW)
    assert (would.since, would.notified_at) == (start, start + timedelta(minutes=60))


def test_change_coded_samples_a_minute_apart_hold_until_the_next_and_make_one_run():
    start = NOW - timedelta(hours=2)
    for second in range(0, 600, 10):  # a snapshot every probe interval, idle and steady for 10 minutes
        send("gpu01", start + timedelta(seconds=second))
    send("gpu01", start + timedelta(minutes=10), utilization=80)
    # Ingest wrote a sample a minute (the heartbeat) and the one that ended the run.
    assert list(GpuSample.objects.order_by("taken_at").values_list("taken_at", flat=True)) == [
        *(start + timedelta(minutes=minute) for minute in range(10)), start + timedelta(minutes=10)]

    # Idle from its first sample until the busy one: 10 minutes, not 9 to its last idle sample.
    (would,) = dry_run.would_have(idle_policy(minutes=10), NOW)
    assert (would.host_name, would.since) == ("gpu01", start)
    assert would.notified_at == start + timedelta(minutes=10) and would.reminded_at is None

