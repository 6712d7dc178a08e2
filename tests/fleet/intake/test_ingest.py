"""receive_snapshot: a good snapshot is stored whole; a bad one is refused and changes nothing stored."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Model
from django.test import override_settings

from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.validation import SnapshotRejected
from gpuadmin.fleet.models import (
    Finding,
    Gpu,
    GpuSample,
    Host,
    HostSample,
    LatestSnapshot,
    ProcessLife,
    SnapshotRejection,
)
from gpuadmin.fleet.signals import snapshot_ingested
from gpuadmin.wire.signing import compress_envelope
from tests.factories import BOOT_ID, GiB, gpu, proc, snapshot
from tests.fleet.helpers import T0, at
from tests.keys import deliver, signed_snapshot

pytestmark = pytest.mark.django_db

GPU0, GPU1 = "GPU-sim-0000", "GPU-sim-0001"
STORED_MODELS: list[type[Model]] = [Host, LatestSnapshot, Gpu, GpuSample, HostSample, ProcessLife, Finding]


def busy_host(taken_seconds: float = 0, **kwargs: Any) -> dict[str, Any]:
    """gpu01: a trainer on GPU 0, a parent with 3 zombies, GPU 1 with memory nobody accounts for."""
    trainer = proc(
        4120,
        cmdline=["python", "train.py"],
        gpu_memory={GPU0: 10 * GiB},
        device_files=["/dev/nvidia0"],
        reasons=["gpu", "device"],
    )
    shell = proc(3000, ppid=1, name="bash", cmdline=["bash"], reasons=["ancestor"])
    parent = proc(5000, ppid=3000, name="python", cmdline=["python", "serve.py"], reasons=["ancestor"])
    zombies = [proc(p, ppid=5000, state="Z", cmdline=[], reasons=["zombie"]) for p in (5001, 5002, 5003)]
    defaults: dict[str, Any] = {
        "processes": [shell, trainer, parent, *zombies],
        "gpus": [gpu(0, used=10 * GiB, utilization_percent=97), gpu(1, used=4 * GiB, utilization_percent=0)],
        "taken_at": at(taken_seconds),
        "pid_max": 4194304,
        "pids_in_use": 612,
    }
    defaults.update(kwargs)
    return snapshot("gpu01", **defaults)


def stored_state() -> dict[str, Any]:
    """Everything ingest may write, as comparable values."""
    state: dict[str, Any] = {m.__name__: list(m.objects.order_by("pk").values()) for m in STORED_MODELS}
    for host in state["Host"]:
        host.pop("last_error")
        host.pop("last_error_at")
    return state


def test_a_good_snapshot_creates_the_host_and_stores_everything(ingest: Callable[..., Host]) -> None:
    document = busy_host()
    host = ingest(document)

    host.refresh_from_db()
    assert host.name == "gpu01"
    assert host.first_seen_at == host.last_seen_at == at(1)
    assert host.last_snapshot_taken_at == T0
    assert host.boot_id == BOOT_ID
    assert host.kernel == "6.18.0-test"
    assert (host.pid_max, host.pids_in_use) == (4194304, 612)
    assert host.process_count == document["process_counts"]["total"]
    assert host.zombie_count == 3
    assert host.gpu_process_count == 1
    assert (host.gpu_backend_name, host.gpu_backend_available, host.gpu_backend_reason) == (
        "simulated",
        True,
        "",
    )
    assert host.last_error == ""

    assert host.latest_snapshot.document == document
    assert host.latest_snapshot.taken_at == T0
    gpus = {g.uuid: g for g in host.gpus.all()}
    assert (gpus[GPU0].memory_used_bytes, gpus[GPU0].memory_attributed_bytes) == (10 * GiB, 10 * GiB)
    assert (gpus[GPU1].memory_used_bytes, gpus[GPU1].memory_unattributed_bytes) == (4 * GiB, 4 * GiB)
    assert gpus[GPU0].utilization_percent == 97
    assert all(g.present for g in gpus.values())

    samples = {s.gpu.uuid: s for s in GpuSample.objects.select_related("gpu")}
    assert samples[GPU1].memory_unattributed_bytes == 4 * GiB
    assert samples[GPU0].taken_at == T0
    (host_sample,) = HostSample.objects.all()
    assert (host_sample.zombie_count, host_sample.pids_in_use) == (3, 612)
    # The trainer and the three zombies matter by themselves; the shell and the parent do not.
    assert sorted(ProcessLife.objects.values_list("pid", flat=True)) == [4120, 5001, 5002, 5003]

    findings = {f.kind: f for f in host.findings.all()}
    assert set(findings) == {Finding.Kind.ZOMBIES, Finding.Kind.UNATTRIBUTED_MEMORY}
    assert findings[Finding.Kind.ZOMBIES].title == "3 zombies under python serve.py (pid 5000, alice)"
    assert findings[Finding.Kind.UNATTRIBUTED_MEMORY].key == GPU1
    assert all(f.first_seen_at == at(1) and f.is_open for f in findings.values())


def test_the_next_snapshot_updates_and_resolves(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(0))
    zombie_finding = Finding.objects.get(kind=Finding.Kind.ZOMBIES)
    # 10 s later: the zombies were reaped, GPU 1 fell off the bus, the trainer grew and a D state appeared.
    trainer = proc(4120, state="D", cmdline=["python", "train.py"], gpu_memory={GPU0: 12 * GiB})
    host = ingest(busy_host(10, processes=[trainer], gpus=[gpu(0, used=12 * GiB)], pids_in_use=600))

    host.refresh_from_db()
    assert (host.zombie_count, host.pids_in_use, host.last_snapshot_taken_at) == (0, 600, at(10))
    assert host.first_seen_at == at(1)
    assert host.last_seen_at == at(11)
    assert not Gpu.objects.get(uuid=GPU1).present
    assert Gpu.objects.get(uuid=GPU0).memory_used_bytes == 12 * GiB
    assert GpuSample.objects.count() == 3  # two, then one
    assert HostSample.objects.count() == 2

    zombie_finding.refresh_from_db()
    assert zombie_finding.resolved_at == at(11)
    assert Finding.objects.get(kind=Finding.Kind.UNATTRIBUTED_MEMORY).resolved_at == at(11)
    assert Finding.objects.get(kind=Finding.Kind.UNINTERRUPTIBLE_GPU).is_open

    lives = {life.pid: life for life in ProcessLife.objects.all()}
    assert lives[4120].gone_at is None
    assert lives[4120].peak_gpu_memory_bytes == 12 * GiB
    assert lives[4120].last_state == "D"
    assert lives[4120].first_seen_at == T0
    assert all(lives[p].gone_at == at(10) for p in (5001, 5002, 5003))


def test_a_finding_still_present_keeps_its_first_sighting(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(0))
    ingest(busy_host(10))
    finding = Finding.objects.get(kind=Finding.Kind.ZOMBIES)
    assert (finding.first_seen_at, finding.last_seen_at, finding.resolved_at) == (at(1), at(11), None)
    assert Finding.objects.count() == 2


def bad_json(document: dict[str, Any]) -> str:
    return json.dumps(document)[:-10]


def schema_violation(document: dict[str, Any]) -> str:
    document["processes"][1]["pid"] = -1
    return json.dumps(document)


def duplicate_pid(document: dict[str, Any]) -> str:
    document["processes"].append(dict(document["processes"][1]))
    return json.dumps(document)


def unknown_gpu(document: dict[str, Any]) -> str:
    document["processes"][1]["gpu_memory_bytes"] = {"GPU-elsewhere": GiB}
    return json.dumps(document)


def oversized(document: dict[str, Any]) -> str:
    document["processes"] += [proc(p, reasons=["all"]) for p in range(10_000, 10_100)]
    return json.dumps(document)


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (bad_json, "snapshot is not valid JSON: "),
        (schema_violation, "processes[1].pid: -1 is less than the minimum of 1"),
        (duplicate_pid, "processes[6].pid: pid 4120 is listed twice (also processes[1])"),
        (unknown_gpu, 'processes[1].gpu_memory_bytes: GPU "GPU-elsewhere" is not in gpus'),
        (oversized, "snapshot is "),
    ],
    ids=["bad-json", "schema", "duplicate-pid", "unknown-gpu", "oversized"],
)
@override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=32 * 1024)
def test_a_bad_snapshot_is_refused_with_a_clear_error_and_changes_nothing_stored(
    ingest: Callable[..., Host], spoil: Callable[[dict[str, Any]], str], message: str
) -> None:
    ingest(busy_host(0))
    before = stored_state()

    with pytest.raises(SnapshotRejected) as caught:
        deliver(spoil(busy_host(10)), received_at=at(11))

    assert caught.value.message.startswith(message)
    assert caught.value.host_name == "gpu01"
    (rejection,) = SnapshotRejection.objects.all()
    assert (rejection.host_name, rejection.error, rejection.received_at) == (
        "gpu01",
        caught.value.message,
        at(11),
    )
    assert rejection.size_bytes > 0
    host = Host.objects.get()
    assert (host.last_error, host.last_error_at) == (caught.value.message, at(11))
    assert stored_state() == before


def test_the_oversized_error_names_the_limit() -> None:
    with override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=1024), pytest.raises(SnapshotRejected) as caught:
        deliver(json.dumps(busy_host()), received_at=at(1))
    assert "over the limit of 1 KiB (GPUADMIN_SNAPSHOT_MAX_BYTES)" in caught.value.message
    assert SnapshotRejection.objects.get().size_bytes == len(json.dumps(busy_host()))


def test_a_compressed_snapshot_that_does_not_inflate_is_refused_with_its_size_as_it_came() -> None:
    message = {**compress_envelope(signed_snapshot(busy_host())), "zlib": "bm90IHpsaWI="}  # "not zlib"
    with pytest.raises(SnapshotRejected) as caught:
        receive_snapshot(message, received_at=at(1))
    assert "does not inflate" in caught.value.message
    assert (SnapshotRejection.objects.get().size_bytes, caught.value.host_name) == (12, "")
    assert not Host.objects.exists()


def test_a_rejected_snapshot_from_an_unknown_host_creates_no_host() -> None:
    with pytest.raises(SnapshotRejected):
        deliver(duplicate_pid(busy_host()), received_at=at(1), accept_key=False)
    assert not Host.objects.exists()
    assert SnapshotRejection.objects.get().host_name == "gpu01"


def test_a_good_snapshot_clears_the_last_error(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(0))
    with pytest.raises(SnapshotRejected):
        deliver(bad_json(busy_host(10)), received_at=at(11))
    assert Host.objects.get().last_error
    ingest(busy_host(20))
    host = Host.objects.get()
    assert (host.last_error, host.last_error_at) == ("", None)


def test_an_older_snapshot_goes_to_history_only(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(20, pids_in_use=700))
    latest_before = LatestSnapshot.objects.get().document
    findings_before = list(Finding.objects.values())
    lives_before = list(ProcessLife.objects.values())

    late = busy_host(10, processes=[], pids_in_use=650)
    ingest(late, received_after_seconds=15)

    host = Host.objects.get()
    assert host.pids_in_use == 700
    assert host.last_snapshot_taken_at == at(20)
    assert host.last_seen_at == at(21)
    assert LatestSnapshot.objects.get().document == latest_before
    assert list(Finding.objects.values()) == findings_before
    assert list(ProcessLife.objects.values()) == lives_before
    assert sorted(HostSample.objects.values_list("taken_at", "pids_in_use")) == [(at(10), 650), (at(20), 700)]
    assert GpuSample.objects.filter(taken_at=at(10)).count() == 2


def test_a_redelivered_snapshot_changes_nothing(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(10))
    ingest(busy_host(20))
    before = stored_state()
    ingest(busy_host(20), received_after_seconds=30)
    ingest(busy_host(10), received_after_seconds=40)
    assert stored_state() == before


def test_listeners_hear_of_each_new_latest_snapshot_after_commit(
    ingest: Callable[..., Host], django_capture_on_commit_callbacks: Any
) -> None:
    heard: list[tuple[str, str]] = []

    def listener(sender: type, host: Host, document: dict[str, Any], **kwargs: Any) -> None:
        heard.append((host.name, document["taken_at"]))

    snapshot_ingested.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            ingest(busy_host(10))
        assert heard == []  # not before the commit
        for callback in callbacks:
            callback()
        assert heard == [("gpu01", busy_host(10)["taken_at"])]
        with django_capture_on_commit_callbacks(execute=True):
            ingest(busy_host(5))  # late: not the latest
            with pytest.raises(SnapshotRejected):
                deliver(bad_json(busy_host(30)), received_at=at(31))
        assert len(heard) == 1
    finally:
        snapshot_ingested.disconnect(listener)


def test_a_reboot_ends_the_lives_of_the_previous_boot(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(0))
    ingest(busy_host(60, boot_id="11111111-2222-3333-4444-555555555555"))
    old = ProcessLife.objects.filter(boot_id=BOOT_ID)
    new = ProcessLife.objects.exclude(boot_id=BOOT_ID)
    assert old.count() == new.count() == 4
    assert all(life.gone_at == at(60) for life in old)
    assert all(life.gone_at is None for life in new)
    assert Host.objects.get().boot_id == "11111111-2222-3333-4444-555555555555"


def test_backend_unavailable_is_stored_with_its_reason(ingest: Callable[..., Host]) -> None:
    document = busy_host(0, backend="none", available=False, reason="NVML library not found", gpus=[])
    for p in document["processes"]:
        p["gpu_memory_bytes"] = {}
    host = ingest(document)
    host.refresh_from_db()
    assert (host.gpu_backend_name, host.gpu_backend_available) == ("none", False)
    assert host.gpu_backend_reason == "NVML library not found"
    finding = host.findings.get(kind=Finding.Kind.GPU_DATA_UNAVAILABLE)
    assert "NVML library not found" in finding.title


def test_two_hosts_are_kept_apart(ingest: Callable[..., Host]) -> None:
    ingest(busy_host(0))
    other = snapshot(
        "gpu02", processes=[proc(4120, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)], taken_at=at(0)
    )
    ingest(other)
    assert Host.objects.count() == 2
    assert Gpu.objects.filter(uuid=GPU0).count() == 2
    assert ProcessLife.objects.filter(pid=4120).count() == 2
    assert Finding.objects.filter(host__name="gpu02").count() == 0


def test_received_at_defaults_to_now() -> None:
    document = busy_host()
    document["taken_at"] = (T0 + timedelta(days=3650)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with pytest.raises(SnapshotRejected, match="ahead of central's clock"):
        deliver(json.dumps(document))
    document["taken_at"] = T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    host = deliver(json.dumps(document))
    assert host.last_seen_at > T0
