"""History: samples per snapshot, process lives only for what matters, in a fixed handful of queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from gpuadmin.fleet.history.record import _add_lives, description_digest
from gpuadmin.fleet.models import GpuSample, Host, HostSample, ProcessLife, ProcessPoint
from gpuadmin.fleet.process_tree import ProcessRow
from gpuadmin.probe.gpus import GpuHealth
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import T0, at
from tests.keys import accept

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"
# Ingesting a snapshot of any size costs at most this many queries (SQLite
# splits a 300-row insert into batches of its 999-parameter limit; PostgreSQL
# needs fewer). Hundreds of processes must never mean hundreds of queries.
MAX_QUERIES_PER_SNAPSHOT = 30


def ddp_job(taken_seconds: float, *, workers: int = 300, memory: int = GiB, **kwargs: Any) -> dict[str, Any]:
    """A launcher and `workers` ranks, each holding GPU memory and the device file."""
    launcher = proc(100, cmdline=["torchrun", "train.py"], reasons=["ancestor"])
    ranks = [
        proc(1000 + i, ppid=100, gpu_memory={GPU0: memory}, device_files=["/dev/nvidia0"], reasons=["gpu"])
        for i in range(workers)
    ]
    return snapshot(
        "gpu01",
        processes=[launcher, *ranks],
        gpus=[gpu(0, used=workers * memory, total=None)],
        taken_at=at(taken_seconds),
        **kwargs,
    )


def test_a_steady_gpu_and_host_write_no_raw_sample_until_the_heartbeat(
    ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 60
    gpus = [gpu(0, used=GiB, utilization_percent=50), gpu(1, used=0, utilization_percent=None)]
    for t in range(0, 140, 10):
        ingest(snapshot("gpu01", processes=[proc(7, gpu_memory={GPU0: GiB})], gpus=gpus, taken_at=at(t),
                        pids_in_use=300))
    # Nothing moved: a sample at the first snapshot, then one each time the last is a minute old.
    assert sorted(GpuSample.objects.values_list("gpu__index", "taken_at")) == [
        (0, at(0)), (0, at(60)), (0, at(120)), (1, at(0)), (1, at(60)), (1, at(120))]
    assert list(HostSample.objects.order_by("taken_at").values_list("taken_at", "pids_in_use")) == [
        (at(0), 300), (at(60), 300), (at(120), 300)]
    sample = GpuSample.objects.get(gpu__index=0, taken_at=at(60))
    figures = (sample.memory_used_bytes, sample.memory_attributed_bytes, sample.utilization_percent)
    assert figures == (GiB, GiB, 50)
    assert GpuSample.objects.get(gpu__index=1, taken_at=at(60)).utilization_percent is None
    host = Host.objects.get()
    assert (host.sampled_at, host.sampled_pids_in_use) == (at(120), 300)


MiB = 2**20


def figures_at(seconds: int, *, used: int = 10 * GiB, held: int = 8 * GiB, utilization: int | None = 50,
               temperature: int = 60, power_draw: int = 300_000, power_limit: int = 700_000,
               pids_in_use: int = 1000, zombies: int = 0, pid_max: int = 4194304) -> dict[str, Any]:
    """One GPU with health, a process holding ``held`` of it, and the host's counts."""
    card = gpu(0, used=used, utilization_percent=utilization)
    card["health"] = GpuHealth(temperature_celsius=temperature, power_draw_milliwatts=power_draw,
                               power_limit_milliwatts=power_limit).as_document()
    holder = proc(7, gpu_memory={GPU0: held})
    dead = [proc(50 + z, ppid=7, state="Z") for z in range(zombies)]
    return snapshot("gpu01", processes=[holder, *dead], gpus=[card], taken_at=at(seconds),
                    pids_in_use=pids_in_use, pid_max=pid_max)


@pytest.mark.parametrize(("moved", "gpu_written", "host_written"), [
    ({}, False, False),
    ({"used": 10 * GiB + 65 * MiB}, True, False),
    ({"used": 10 * GiB + 64 * MiB}, False, False),  # by the step, not past it
    ({"held": 8 * GiB - 65 * MiB}, True, False),
    ({"held": 8 * GiB - 64 * MiB}, False, False),
    ({"utilization": 61}, True, False),
    ({"utilization": 40}, False, False),
    ({"utilization": 0}, True, False),  # going idle is news, whatever the step
    ({"utilization": None}, True, False),  # and so is a GPU that stops saying
    ({"temperature": 64}, True, False),
    ({"temperature": 57}, False, False),
    ({"power_draw": 325_001}, True, False),
    ({"power_draw": 275_000}, False, False),
    ({"power_limit": 699_000}, True, False),  # any change
    ({"pids_in_use": 1101}, False, True),
    ({"pids_in_use": 900}, False, False),
    ({"zombies": 1}, False, True),
    ({"pid_max": 32768}, False, True),
], ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) or "nothing" if isinstance(value, dict)
   else str(value))
def test_a_figure_moved_past_its_step_writes_one_sample(
    ingest: Callable[..., Host], settings: Any, moved: dict[str, Any], gpu_written: bool, host_written: bool
) -> None:
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 60
    settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES = 64 * MiB
    ingest(figures_at(0))
    ingest(figures_at(10, **moved))
    assert GpuSample.objects.filter(taken_at=at(10)).exists() is gpu_written
    assert HostSample.objects.filter(taken_at=at(10)).exists() is host_written
    if gpu_written:
        sample = GpuSample.objects.get(taken_at=at(10))
        after = figures_at(10, **moved)
        card, health = after["gpus"][0], after["gpus"][0]["health"]
        assert (sample.memory_used_bytes, sample.memory_attributed_bytes, sample.utilization_percent,
                sample.temperature_celsius, sample.power_draw_milliwatts, sample.power_limit_milliwatts) == (
            card["memory_used_bytes"], moved.get("held", 8 * GiB), card["utilization_percent"],
            health["temperature_celsius"], health["power_draw_milliwatts"], health["power_limit_milliwatts"])


def test_figures_are_compared_with_the_last_written_sample_not_the_last_snapshot(
    ingest: Callable[..., Host], settings: Any
) -> None:
    """A slow drift, under the step from one snapshot to the next, is written once it adds up past it."""
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 600
    settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES = 64 * MiB
    for n in range(6):
        ingest(figures_at(10 * n, used=10 * GiB + n * 40 * MiB, pids_in_use=1000 + 60 * n))
    assert sorted(GpuSample.objects.values_list("taken_at", "memory_used_bytes")) == [
        (at(0), 10 * GiB), (at(20), 10 * GiB + 80 * MiB), (at(40), 10 * GiB + 160 * MiB)]
    assert sorted(HostSample.objects.values_list("taken_at", "pids_in_use")) == [
        (at(0), 1000), (at(20), 1120), (at(40), 1240)]


def test_a_late_snapshot_still_writes_its_samples_and_leaves_the_last_written_ones(
    ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 60
    ingest(figures_at(0))
    ingest(figures_at(20))
    ingest(figures_at(10, utilization=90))  # late: what it says is true of its moment
    assert sorted(GpuSample.objects.values_list("taken_at", "utilization_percent")) == [
        (at(0), 50), (at(10), 90)]
    assert Host.objects.get().gpus.get().sampled_at == at(0)
    ingest(figures_at(30, utilization=55))  # compared with the newest snapshot's last written: 50
    assert not GpuSample.objects.filter(taken_at=at(30)).exists()


@pytest.mark.parametrize("first", [True, False], ids=["first-snapshot", "next-snapshot"])
def test_a_snapshot_with_300_gpu_processes_costs_a_handful_of_queries(
    ingest: Callable[..., Host], django_assert_max_num_queries: Any, first: bool
) -> None:
    if not first:
        ingest(ddp_job(0))
    else:
        accept(ddp_job(0)["host"]["name"])  # enrolled before its first snapshot: the snapshot's cost alone
    with django_assert_max_num_queries(MAX_QUERIES_PER_SNAPSHOT):
        ingest(ddp_job(10, memory=2 * GiB))
    assert ProcessLife.objects.count() == 300
    assert ProcessLife.objects.filter(last_gpu_memory_bytes=2 * GiB, gone_at=None).count() == 300


def test_a_snapshot_that_ends_300_lives_costs_a_handful_of_queries(
    ingest: Callable[..., Host], django_assert_max_num_queries: Any
) -> None:
    ingest(ddp_job(0))
    with django_assert_max_num_queries(MAX_QUERIES_PER_SNAPSHOT):
        ingest(ddp_job(10, workers=0))
    assert ProcessLife.objects.filter(gone_at=at(10)).count() == 300


def test_1000_ordinary_processes_add_no_process_lives(ingest: Callable[..., Host]) -> None:
    ordinary = [proc(p, ppid=1, reasons=["all"]) for p in range(2, 1002)]
    document = snapshot("gpu01", processes=ordinary, taken_at=at(0))
    document["scope"] = "all"
    ingest(document)
    assert ProcessLife.objects.count() == 0
    assert HostSample.objects.count() == 1


def test_ancestors_and_descendants_get_no_life_of_their_own(ingest: Callable[..., Host]) -> None:
    launcher = proc(100, ppid=1, reasons=["ancestor"])
    holder = proc(101, ppid=100, gpu_memory={GPU0: GiB}, reasons=["gpu"])
    child = proc(102, ppid=101, reasons=["descendant"])
    dataloader_orphan = proc(200, ppid=1, orphaned=True, pgid=150, sid=150, reasons=["descendant"])
    stuck = proc(300, state="D", reasons=["uninterruptible"])
    ingest(
        snapshot(
            "gpu01",
            processes=[launcher, holder, child, dataloader_orphan, stuck],
            gpus=[gpu(0, used=GiB)],
            taken_at=at(0),
        )
    )
    assert sorted(ProcessLife.objects.values_list("pid", flat=True)) == [101, 200, 300]


def test_a_life_records_peak_memory_and_flags_across_snapshots(ingest: Callable[..., Host]) -> None:
    def worker(memory: int, **kwargs: Any) -> list[dict[str, Any]]:
        return [proc(1000, ppid=1, gpu_memory={GPU0: memory}, device_files=["/dev/nvidia0"], **kwargs)]

    ingest(snapshot("gpu01", processes=worker(2 * GiB), gpus=[gpu(0, used=8 * GiB)], taken_at=at(0)))
    ingest(
        snapshot(
            "gpu01", processes=worker(8 * GiB, orphaned=True), gpus=[gpu(0, used=8 * GiB)], taken_at=at(10)
        )
    )
    ingest(snapshot("gpu01", processes=worker(3 * GiB), gpus=[gpu(0, used=8 * GiB)], taken_at=at(20)))

    life = ProcessLife.objects.get()
    assert (life.first_seen_at, life.last_seen_at, life.gone_at) == (T0, at(20), None)
    assert (life.last_gpu_memory_bytes, life.peak_gpu_memory_bytes) == (3 * GiB, 8 * GiB)
    assert life.held_device
    assert life.was_orphaned
    assert not life.was_zombie
    assert life.cmdline == ["python", "job1000.py"]
    assert (life.user, life.uid, life.ppid) == ("alice", 1000, 1)


def test_a_reused_pid_starts_a_new_life(ingest: Callable[..., Host]) -> None:
    ingest(
        snapshot(
            "gpu01",
            processes=[proc(1000, start=5, gpu_memory={GPU0: GiB})],
            gpus=[gpu(0, used=GiB)],
            taken_at=at(0),
        )
    )
    ingest(
        snapshot(
            "gpu01",
            processes=[proc(1000, start=9000, gpu_memory={GPU0: GiB})],
            gpus=[gpu(0, used=GiB)],
            taken_at=at(10),
        )
    )
    lives = list(ProcessLife.objects.order_by("start_time_ticks").values_list("start_time_ticks", "gone_at"))
    assert lives == [(5, at(10)), (9000, None)]


def test_a_process_that_stops_mattering_but_stays_in_the_snapshot_is_kept_current(
    ingest: Callable[..., Host],
) -> None:
    parent = proc(100, reasons=["ancestor"])
    holder = proc(101, ppid=100, gpu_memory={GPU0: GiB})
    ingest(snapshot("gpu01", processes=[parent, holder], gpus=[gpu(0, used=GiB)], taken_at=at(0)))
    # 101 freed its memory but is still the parent of a new holder.
    freed = proc(101, ppid=100, reasons=["ancestor"])
    child = proc(102, ppid=101, gpu_memory={GPU0: GiB})
    ingest(snapshot("gpu01", processes=[parent, freed, child], gpus=[gpu(0, used=GiB)], taken_at=at(10)))
    life = ProcessLife.objects.get(pid=101)
    assert (life.last_seen_at, life.gone_at, life.last_gpu_memory_bytes, life.peak_gpu_memory_bytes) == (
        at(10),
        None,
        0,
        GiB,
    )
    # Gone from the snapshot altogether: the life ends; back again: it reopens with its history.
    ingest(snapshot("gpu01", processes=[], gpus=[gpu(0, used=0)], taken_at=at(20)))
    assert ProcessLife.objects.get(pid=101).gone_at == at(20)
    ingest(snapshot("gpu01", processes=[holder], gpus=[gpu(0, used=GiB)], taken_at=at(30)))
    life = ProcessLife.objects.get(pid=101)
    assert (life.first_seen_at, life.last_seen_at, life.gone_at) == (T0, at(30), None)
    assert ProcessLife.objects.get(pid=102).gone_at == at(20)


def test_lives_of_other_hosts_are_left_alone(ingest: Callable[..., Host]) -> None:
    for name in ("gpu01", "gpu02"):
        ingest(
            snapshot(
                name, processes=[proc(1000, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)], taken_at=at(0)
            )
        )
    ingest(snapshot("gpu01", processes=[], gpus=[gpu(0, used=0)], taken_at=at(10)))
    assert ProcessLife.objects.get(host__name="gpu01").gone_at == at(10)
    assert ProcessLife.objects.get(host__name="gpu02").gone_at is None


def _holder_at(seconds: float, memory: int, *, state: str = "R") -> dict[str, Any]:
    return snapshot(
        "gpu01",
        processes=[proc(1000, state=state, gpu_memory={GPU0: memory})],
        gpus=[gpu(0, used=memory)],
        taken_at=at(seconds),
    )


def test_a_steady_process_costs_one_point_and_changes_add_points(
    ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES = 64 * 1024**2
    memories = [GiB, GiB, GiB + 10 * 1024**2, GiB, 2 * GiB, 2 * GiB]
    for i, memory in enumerate(memories):
        ingest(_holder_at(i * 10, memory))
    ingest(_holder_at(60, 2 * GiB, state="D"))
    ingest(_holder_at(70, 0, state="D"))
    points = list(
        ProcessPoint.objects.order_by("taken_at").values_list("taken_at", "gpu_memory_bytes", "state")
    )
    # A 10 MiB wobble is no change; a 1 GiB step, a new state and memory freed are.
    assert points == [(at(0), GiB, "R"), (at(40), 2 * GiB, "R"), (at(60), 2 * GiB, "D"), (at(70), 0, "D")]
    life = ProcessLife.objects.get()
    assert (life.point_gpu_memory_bytes, life.point_state, life.last_seen_at) == (0, "D", at(70))


def test_a_life_counts_the_snapshots_its_memory_rose_in_until_it_falls(ingest: Callable[..., Host]) -> None:
    for i, memory in enumerate([1, 2, 2, 3, 4]):
        ingest(_holder_at(i * 10, memory * GiB))
    life = ProcessLife.objects.get()
    assert (life.memory_rising_samples, life.memory_rising_since, life.memory_rising_from_bytes) == (
        3,
        at(0),
        GiB,
    )
    ingest(_holder_at(50, 3 * GiB))
    life.refresh_from_db()
    assert (life.memory_rising_samples, life.memory_rising_since) == (0, None)


def test_a_life_keeps_the_owner_of_its_process(ingest: Callable[..., Host]) -> None:
    job = {"kind": "slurm_job", "job_id": "4242", "step": "0", "uid": 1000}
    ingest(snapshot("gpu01", processes=[proc(7, gpu_memory={GPU0: GiB}, owner=job)],
                    gpus=[gpu(0, used=GiB)], taken_at=at(0)))
    ingest(snapshot("gpu01", processes=[proc(8, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)],
                    taken_at=at(10)))
    lives = {life.pid: life for life in ProcessLife.objects.all()}
    assert lives[7].owner == job
    assert lives[7].gone_at is not None  # the owner outlives the process in history
    assert lives[8].owner is None


def test_a_description_digest_is_the_same_in_every_worker_process() -> None:
    # Two central workers ingest one host's snapshots in turn: a digest that hashed with Python's
    # per-process seed would find every life changed whenever the other worker wrote it.
    owner = {"kind": "slurm_job", "job_id": "42", "step": "0", "uid": 7}
    record = proc(7, gpu_memory={GPU0: GiB}, owner=owner)
    here = description_digest(ProcessRow.from_document(record))
    code = (
        "import json, sys, django; django.setup()\n"
        "from gpuadmin.fleet.history.record import description_digest\n"
        "from gpuadmin.fleet.process_tree import ProcessRow\n"
        "print(description_digest(ProcessRow.from_document(json.loads(sys.argv[1]))))\n"
    )
    seeds = {}
    for seed in ("1", "2"):
        child = subprocess.run([sys.executable, "-c", code, json.dumps(record)], capture_output=True,
                               text=True, env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        seeds[seed] = int(child.stdout)
    assert seeds == {"1": here, "2": here}
    moved = description_digest(ProcessRow.from_document({**record, "cmdline": ["python", "other.py"]}))
    assert moved != here


def test_a_description_digest_keeps_its_value_across_releases() -> None:
    # Stored lives keep the digest of their description: a new way of computing it that gave other
    # values would find every open life changed once, and rewrite them all. Values as stop 27 gave them.
    owner = {"kind": "slurm_job", "job_id": "42", "step": "0", "uid": 7}
    assert description_digest(ProcessRow.from_document(proc(7, owner=owner))) == -3017617851121095684
    bare = {"pid": 3, "ppid": 1, "state": "S", "start_time_ticks": 1}
    assert description_digest(ProcessRow.from_document(bare)) == -351599472650376275


def test_stored_lives_of_another_width_than_their_columns_are_refused() -> None:
    known: dict = {}
    columns = ["pk", "boot_id", "pid", "start_time_ticks", "last_state"]
    _add_lives(known, [(1, "b", 7, 70, "S"), (2, "b", 8, 80, "R")], columns)
    assert known[("b", 8, 80)] == dict(zip(columns, (2, "b", 8, 80, "R"), strict=True))
    with pytest.raises(ValueError, match="4 values for 5 columns"):
        _add_lives({}, [(1, "b", 7, 70)], columns)


def test_a_snapshot_with_more_holders_than_the_cap_keeps_the_biggest_and_the_page_says_so(
    ingest: Callable[..., Host], settings: Any, viewer_client: Any,
) -> None:
    """A signed snapshot may list any number of made-up holders: at most the cap get a life each time."""
    settings.GPUADMIN_HISTORY_PROCESSES_PER_SNAPSHOT = 20

    def holders(taken_seconds: float, first_pid: int) -> dict[str, Any]:
        # 300 holders, each a MiB bigger than the one before: the last 20 are the biggest.
        ranks = [proc(first_pid + i, gpu_memory={GPU0: GiB + i * 2**20}, reasons=["gpu"]) for i in range(300)]
        return snapshot("gpu01", processes=ranks, gpus=[gpu(0, used=GiB, total=None)],
                        taken_at=at(taken_seconds))

    host = ingest(holders(0, 1000))
    assert sorted(ProcessLife.objects.values_list("pid", flat=True)) == list(range(1280, 1300))
    assert ProcessPoint.objects.count() == 20
    assert (host.history_processes_kept_count, host.history_processes_mattering_count) == (20, 300)
    # Another 300 made-up holders: 20 new lives, and the 20 before end (no more than 20 stay open).
    ingest(holders(10, 5000))
    assert ProcessLife.objects.filter(gone_at__isnull=True).count() == 20
    assert ProcessLife.objects.count() == 40 and ProcessPoint.objects.count() == 40

    page = viewer_client.get("/hosts/gpu01/").content.decode()
    assert "History kept for the 20 largest of 300 GPU holders" in page
    # A snapshot under the cap: every process keeps its history, and the notice goes.
    ingest(snapshot("gpu01", processes=[proc(7, gpu_memory={GPU0: GiB})], gpus=[gpu(0, used=GiB)],
                    taken_at=at(20)))
    assert Host.objects.get(name="gpu01").history_processes_mattering_count == 0
    assert "History kept for" not in viewer_client.get("/hosts/gpu01/").content.decode()


def launched_workers(taken_seconds: float, *, launcher_alive: bool, orphaned: bool = True) -> dict[str, Any]:
    """A launcher (pid 100, bob's ``torchrun train.py``) and two workers on the GPU; once it is gone,
    the workers re-parented to PID 1 (``orphaned``: left behind, as the probe says of a worker)."""
    launcher = proc(100, ppid=1, user="bob", cmdline=["torchrun", "train.py"], reasons=["ancestor"])
    workers = [
        proc(pid, ppid=100 if launcher_alive else 1, pgid=100, sid=100, gpu_memory={GPU0: GiB},
             orphaned=orphaned and not launcher_alive, reasons=["gpu"])
        for pid in (101, 102)
    ]
    return snapshot("gpu01", processes=[launcher, *workers] if launcher_alive else workers,
                    gpus=[gpu(0, used=2 * GiB)], taken_at=at(taken_seconds))


LAUNCHER_FIELDS = ["pid", "launcher_pid", "launcher_name", "launcher_user", "launcher_exited_after",
                   "launcher_exited_before"]


def test_a_life_names_the_launcher_it_outlived_and_between_which_snapshots_it_exited(
    ingest: Callable[..., Host],
) -> None:
    ingest(launched_workers(0, launcher_alive=True))
    ingest(launched_workers(10, launcher_alive=True))
    parents = ProcessLife.objects.order_by("pid").values_list("parent_name", "parent_user", "launcher_pid")
    assert list(parents) == [("torchrun train.py", "bob", None), ("torchrun train.py", "bob", None)]
    ingest(launched_workers(20, launcher_alive=False))
    ingest(launched_workers(30, launcher_alive=False))  # a later snapshot keeps what the first one saw

    assert list(ProcessLife.objects.order_by("pid").values_list(*LAUNCHER_FIELDS)) == [
        (pid, 100, "torchrun train.py", "bob", at(10), at(20)) for pid in (101, 102)
    ]
    # The parent is now PID 1, which the snapshot does not have.
    assert set(ProcessLife.objects.values_list("ppid", "parent_name", "parent_user")) == {(1, "", "")}


def test_a_process_re_parented_without_being_left_behind_names_no_launcher(
    ingest: Callable[..., Host],
) -> None:
    ingest(launched_workers(0, launcher_alive=True))
    ingest(launched_workers(10, launcher_alive=False, orphaned=False))  # a daemon: re-parented on purpose
    assert set(ProcessLife.objects.values_list("ppid", "launcher_pid", "launcher_name")) == {(1, None, "")}


def test_a_process_first_seen_orphaned_names_no_launcher(ingest: Callable[..., Host]) -> None:
    ingest(launched_workers(0, launcher_alive=False))
    ingest(launched_workers(10, launcher_alive=False))
    assert set(ProcessLife.objects.values_list("launcher_pid", flat=True)) == {None}
