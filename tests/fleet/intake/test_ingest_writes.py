"""Ingest writes what changed: steady processes, GPUs and findings cost no rewrite (issue 9, ingest rate).

A snapshot where nothing but the clock moved must not rewrite process lives (not
even their last_seen_at) or findings (only their last_seen_at), and a change must
still be stored whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast
from django.test.utils import CaptureQueriesContext

from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.models import Finding, Gpu, GpuSample, Host, LatestSnapshot, ProcessLife, ProcessPoint
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner, snapshot
from tests.fleet.helpers import at, counted_round_trips
from tests.keys import accept, deliver, signed_snapshot

pytestmark = pytest.mark.django_db

GPU0, GPU1 = "GPU-sim-0000", "GPU-sim-0001"


def trainers(taken_seconds: float, *, memory: dict[int, int] | None = None, zombies: bool = False,
             gpus: list[dict[str, Any]] | None = None, **changes: Any) -> dict[str, Any]:
    """gpu01: three trainers on GPU 0 (memory per pid, 4 GiB unless given), optionally a parent
    with two zombies; ``changes`` are extra fields of pid 11's record."""
    memory = memory or {}
    processes = [
        proc(pid, gpu_memory={GPU0: memory.get(pid, 4 * GiB)}, device_files=["/dev/nvidia0"],
             reasons=["gpu"], **(changes if pid == 11 else {}))
        for pid in (10, 11, 12)
    ]
    if zombies:
        processes.append(proc(50, name="leaky", cmdline=["leaky"], reasons=["ancestor"]))
        processes += [proc(p, ppid=50, state="Z", cmdline=[], reasons=["zombie"]) for p in (51, 52)]
    gpus = gpus or [gpu(0, used=12 * GiB, utilization_percent=90)]
    return snapshot("gpu01", processes=processes, gpus=gpus, taken_at=at(taken_seconds))


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL statements run inside the block (filled in when it ends)."""
    seen: list[str] = []
    with CaptureQueriesContext(connection) as captured:
        yield seen
    seen += [q["sql"] for q in captured.captured_queries]


def writes_to(table: str, sql: list[str]) -> list[str]:
    """Statements that insert or rewrite rows of ``table`` (not the UPDATE of last_seen_at alone)."""
    only_seen = re.compile(rf'UPDATE "{table}" SET "last_seen_at" = [^,]+')
    return [s for s in sql if s.startswith(f'INSERT INTO "{table}"')
            or (s.startswith(f'UPDATE "{table}"') and not only_seen.fullmatch(s.split(" WHERE ")[0]))]


def test_a_snapshot_where_nothing_changed_rewrites_no_process_life(ingest: Callable[..., Host]) -> None:
    ingest(trainers(0))
    ingest(trainers(10))
    with statements() as sql:
        ingest(trainers(20))
    assert writes_to("fleet_processlife", sql) == []
    assert writes_to("fleet_processpoint", sql) == []
    # Not even last_seen_at: an open life is in every snapshot of its host, so it was seen at 20.
    assert not [s for s in sql if s.startswith('UPDATE "fleet_processlife"')]
    # One read of the host's open lives, without a list of PIDs to bind.
    life_reads = [s for s in sql if s.startswith("SELECT") and 'FROM "fleet_processlife"' in s]
    assert len(life_reads) == 1 and " IN (" not in life_reads[0]
    lives = ProcessLife.objects.select_related("host").order_by("pid")
    assert [(life.pid, life.last_seen_at, life.latest_sighting_at()) for life in lives] == [
        (10, at(0), at(20)), (11, at(0), at(20)), (12, at(0), at(20))
    ]


def test_an_open_life_is_compared_by_the_digest_of_its_description_not_by_reading_it(
    ingest: Callable[..., Host],
) -> None:
    ingest(trainers(0))
    with statements() as sql:
        ingest(trainers(10))
    (life_read,) = [s for s in sql if s.startswith("SELECT") and 'FROM "fleet_processlife"' in s]
    assert '"description_digest"' in life_read
    assert not re.search(r'"(cmdline|owner|user|name|ppid|uid|container_id)"', life_read.split(" FROM ")[0])
    # Lives stored before the digest existed: each is written once, with it, then steady again.
    ProcessLife.objects.update(description_digest=None)
    with statements() as sql:
        ingest(trainers(20))
    assert len(writes_to("fleet_processlife", sql)) == 1
    assert not ProcessLife.objects.filter(description_digest=None).exists()
    with statements() as sql:
        ingest(trainers(30))
    assert writes_to("fleet_processlife", sql) == []


def test_steady_lives_are_never_rewritten_however_long_they_run(ingest: Callable[..., Host]) -> None:
    """Not even to bring their stored last_seen_at up to date: that was one UPDATE of every open life
    of the host, most of a full snapshot's PostgreSQL time after minutes of snapshot updates."""
    for seconds in range(0, 600, 10):
        ingest(trainers(seconds))
    ended = trainers(600)
    ended["processes"] = [p for p in ended["processes"] if p["pid"] != 12]
    with statements() as sql:
        ingest(ended)
    (ending,) = [s for s in sql if s.startswith('UPDATE "fleet_processlife"')]
    assert '"gone_at" = ' in ending.split(" WHERE ")[0]
    # The life that ends is last seen by the snapshot before; the open ones as the host's newest.
    lives = ProcessLife.objects.select_related("host").order_by("pid")
    assert [(life.pid, life.last_seen_at, life.gone_at, life.latest_sighting_at()) for life in lives] == [
        (10, at(0), None, at(600)), (11, at(0), None, at(600)), (12, at(590), at(600), at(590))
    ]


def test_only_processes_without_an_open_life_are_looked_up_among_gone_ones(
    ingest: Callable[..., Host]
) -> None:
    ingest(trainers(0))
    ingest(trainers(10))
    newcomer = trainers(20)
    newcomer["processes"].append(
        proc(13, gpu_memory={GPU0: GiB}, device_files=["/dev/nvidia0"], reasons=["gpu"])
    )
    with statements() as sql:
        ingest(newcomer)
    life_reads = [s for s in sql if s.startswith("SELECT") and 'FROM "fleet_processlife"' in s]
    assert len(life_reads) == 2
    assert re.search(r'"pid" IN \(13\)', life_reads[1])
    assert ProcessLife.objects.get(pid=13).first_seen_at == at(20)


def test_a_life_that_ends_was_last_seen_by_the_snapshot_before(ingest: Callable[..., Host]) -> None:
    for seconds in (0, 10, 20):
        ingest(trainers(seconds))
    gone = trainers(30)
    gone["processes"] = [p for p in gone["processes"] if p["pid"] != 12]
    ingest(gone)
    life = ProcessLife.objects.select_related("host").get(pid=12)
    # Stored as 0 while it was steady; the snapshot at 20 was the last to show it.
    assert (life.last_seen_at, life.gone_at, life.latest_sighting_at()) == (at(20), at(30), at(20))
    assert ProcessLife.objects.select_related("host").get(pid=11).latest_sighting_at() == at(30)


def test_a_changed_process_is_still_stored_whole_and_only_it(ingest: Callable[..., Host]) -> None:
    ingest(trainers(0))
    ingest(trainers(10))
    with statements() as sql:
        ingest(trainers(20, memory={11: 9 * GiB}))
    upserts = [s for s in sql if s.startswith('INSERT INTO "fleet_processlife"')]
    assert len(upserts) == 1
    changed = ProcessLife.objects.get(pid=11)
    assert (changed.last_gpu_memory_bytes, changed.peak_gpu_memory_bytes, changed.last_seen_at) == (
        9 * GiB, 9 * GiB, at(20)
    )
    assert (changed.memory_rising_samples, changed.memory_rising_since) == (1, at(10))
    assert list(ProcessPoint.objects.filter(life=changed).values_list("taken_at", "gpu_memory_bytes")) == [
        (at(0), 4 * GiB), (at(20), 9 * GiB)
    ]
    steady = ProcessLife.objects.select_related("host").get(pid=10)
    assert (steady.last_gpu_memory_bytes, steady.latest_sighting_at(), steady.first_seen_at) == (
        4 * GiB, at(20), at(0)
    )
    assert ProcessPoint.objects.filter(life=steady).count() == 1


@pytest.mark.parametrize("change", [
    {"cmdline": ["python", "train.py", "--resume"]},  # exec: same pid and start, new command line
    {"owner": slurm_owner("77")},
    {"owner": container_owner("c0ffee0d" * 8), "container_id": "c0ffee0d" * 8},
    {"user": "bob", "uid": 1001},
    {"ppid": 99},
    {"state": "D"},
    {"orphaned": True},
], ids=["cmdline", "slurm-owner", "container", "user", "ppid", "state", "orphaned"])
def test_any_stored_value_that_changes_is_written(
    ingest: Callable[..., Host], change: dict[str, Any]
) -> None:
    ingest(trainers(0))
    ingest(trainers(10, **change))
    life = ProcessLife.objects.get(pid=11)
    stored = {
        "cmdline": life.cmdline, "owner": life.owner, "container_id": life.container_id, "user": life.user,
        "uid": life.uid, "ppid": life.ppid, "state": life.last_state, "orphaned": life.was_orphaned,
    }
    assert {key: stored[key] for key in change} == change
    assert life.last_seen_at == at(10)


def test_a_life_that_left_and_came_back_is_reopened(ingest: Callable[..., Host]) -> None:
    ingest(trainers(0))
    gone = trainers(10)
    gone["processes"] = [p for p in gone["processes"] if p["pid"] != 11]
    ingest(gone)
    assert ProcessLife.objects.get(pid=11).gone_at == at(10)
    ingest(trainers(20))
    back = ProcessLife.objects.get(pid=11)
    assert (back.gone_at, back.first_seen_at, back.last_seen_at) == (None, at(0), at(20))


def test_unchanged_findings_are_only_seen_again_and_a_changed_one_is_rewritten(
    ingest: Callable[..., Host],
) -> None:
    ingest(trainers(0, zombies=True))
    finding = Finding.objects.get(kind=Finding.Kind.ZOMBIES)
    with statements() as sql:
        ingest(trainers(10, zombies=True))
    assert writes_to("fleet_finding", sql) == []
    finding.refresh_from_db()
    # The ingest fixture receives each snapshot a second after it was taken.
    assert (finding.first_seen_at, finding.last_seen_at, finding.resolved_at) == (at(1), at(11), None)
    # A third zombie changes the finding's title and details: rewritten, still the same episode.
    more = trainers(20, zombies=True)
    more["processes"].append(proc(53, ppid=50, state="Z", cmdline=[], reasons=["zombie"]))
    more["process_counts"]["zombies"] = 3
    with statements() as sql:
        ingest(more)
    assert len(writes_to("fleet_finding", sql)) == 1
    finding.refresh_from_db()
    assert finding.details["zombie_count"] == 3 and finding.title.startswith("3 zombies")
    assert (finding.first_seen_at, finding.last_seen_at) == (at(1), at(21))


def test_gpus_are_upserted_without_a_read_back_and_keep_their_idle_since(ingest: Callable[..., Host]) -> None:
    idle = [gpu(0, used=12 * GiB, utilization_percent=0)]
    ingest(trainers(0, gpus=idle))
    first = Gpu.objects.get(uuid=GPU0)
    assert first.idle_since == at(0)
    with statements() as sql:
        ingest(trainers(10, gpus=idle))
    assert len([s for s in sql if '"fleet_gpu"' in s.split("WHERE")[0] and s.startswith("SELECT")]) == 1
    again = Gpu.objects.get(uuid=GPU0)
    assert (again.pk, again.idle_since, again.updated_at, again.present) == (first.pk, at(0), at(11), True)
    # Its figures did not move: no raw sample until the heartbeat (history/record.py).
    assert GpuSample.objects.filter(gpu=again).count() == 1
    # Computing again: idle_since cleared by one UPDATE of that GPU alone.
    with statements() as sql:
        ingest(trainers(20, gpus=[gpu(0, used=12 * GiB, utilization_percent=40)]))
    (cleared,) = [s for s in sql if 'UPDATE "fleet_gpu"' in s]
    assert 'UPDATE "fleet_gpu" SET "idle_since" = ' in cleared and "CASE" not in cleared
    assert Gpu.objects.get(uuid=GPU0).idle_since is None


def test_a_new_gpu_gets_its_row_and_samples_and_a_missing_one_is_marked_not_present(
    ingest: Callable[..., Host],
) -> None:
    ingest(trainers(0))
    both = [gpu(0, used=12 * GiB, utilization_percent=90), gpu(1, used=GiB, utilization_percent=5)]
    ingest(trainers(10, gpus=both))
    added = Gpu.objects.get(uuid=GPU1)
    assert added.present and added.memory_used_bytes == GiB
    assert GpuSample.objects.get(gpu=added).taken_at == at(10)
    ingest(trainers(20))
    added.refresh_from_db()
    assert (added.present, added.updated_at) == (False, at(21))
    assert Gpu.objects.get(uuid=GPU0).present


def test_a_signed_snapshot_locks_its_host_row_once() -> None:
    accept("gpu01")
    receive_snapshot(signed_snapshot(trainers(0)), received_at=at(1))
    with statements() as sql:
        host = receive_snapshot(signed_snapshot(trainers(10)), received_at=at(11))
    assert host is not None and host.last_snapshot_taken_at == at(10)
    host_reads = [s for s in sql if s.startswith("SELECT") and 'FROM "fleet_host"' in s]
    assert len(host_reads) == 1
    # The read is the lock (compiled once by fleet.storage.statements, it must still say so).
    assert host_reads[0].endswith(" FOR UPDATE") == connection.features.has_select_for_update
    # The test's own transaction makes receive_snapshot's a savepoint; nothing inside adds one.
    assert len([s for s in sql if s.startswith("SAVEPOINT")]) <= 1
    assert ProcessLife.objects.select_related("host").get(pid=11).latest_sighting_at() == at(10)


def test_the_pid_trend_is_read_only_while_zombies_grow(ingest: Callable[..., Host]) -> None:
    def trend_reads(sql: list[str]) -> list[str]:
        return [s for s in sql if s.startswith("SELECT") and 'FROM "fleet_hostsample"' in s]

    ingest(trainers(0))
    with statements() as sql:
        ingest(trainers(10))
    assert trend_reads(sql) == []  # no zombies: nothing read
    with statements() as sql:
        ingest(trainers(20, zombies=True))
    # Two zombies now, none at the window's start: the oldest sample's count, then the trend.
    assert [s.endswith("LIMIT 1") for s in trend_reads(sql)] == [True, False]
    with statements() as sql:
        ingest(trainers(30, zombies=True))
    assert [s.endswith("LIMIT 1") for s in trend_reads(sql)] == [True, False]  # still more than at 0
    ingest(trainers(200, zombies=True))
    with statements() as sql:
        ingest(trainers(3700, zombies=True))
    # The window (an hour back, from 100) starts at 200 with the same two zombies: not growing, one
    # count read.
    assert [s.endswith("LIMIT 1") for s in trend_reads(sql)] == [True]


def test_a_database_that_returns_no_ids_from_an_upsert_gets_them_read_back(
    ingest: Callable[..., Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    ingest(trainers(0))
    both = [gpu(0, used=12 * GiB, utilization_percent=90), gpu(1, used=GiB, utilization_percent=5)]
    ingest(trainers(10, gpus=both, memory={11: 9 * GiB}))
    assert GpuSample.objects.filter(gpu__uuid=GPU1, taken_at=at(10)).exists()
    moved = ProcessLife.objects.get(pid=11)
    assert list(ProcessPoint.objects.filter(life=moved).values_list("gpu_memory_bytes", flat=True)) == [
        4 * GiB, 9 * GiB
    ]


def test_the_latest_document_is_stored_from_the_text_as_received() -> None:
    """The steady path stores the validated text itself (no second encoding); what is read back is the
    document the text says, whatever its spacing, escapes or number spelling."""
    first = trainers(0)
    deliver(json.dumps(first), received_at=at(1))
    second = trainers(10, name="tr\u00e4iner \U0001f600")
    text = json.dumps(second, indent=2).replace('"elapsed_seconds": 60.0', '"elapsed_seconds": 6e1')
    assert "\\ud83d\\ude00" in text and "6e1" in text
    with statements() as sql:
        deliver(text, received_at=at(11))
    stored = LatestSnapshot.objects.get(host__name="gpu01")
    assert stored.document == second and stored.taken_at == at(10)
    assert stored.document["processes"][1]["name"] == "tr\u00e4iner \U0001f600"
    assert len([s for s in sql if s.startswith('INSERT INTO "fleet_latestsnapshot"')]) == 1  # one upsert
    # The text itself went to the database: a second encoding would have written 60.0.
    assert LatestSnapshot.objects.filter(pk=stored.pk).values_list(Cast("document", TextField()),
                                                                   flat=True).get() == text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_steady_signed_snapshot_costs_nine_round_trips_to_postgresql() -> None:
    accept("gpu01")
    for seconds in (0, 10):  # the host known, its statements prepared
        receive_snapshot(signed_snapshot(trainers(seconds)), received_at=at(seconds + 1))
    with counted_round_trips() as counted:
        receive_snapshot(signed_snapshot(trainers(20)), received_at=at(21))
    # BEGIN; the host's lock; its GPUs, open lives and open findings, each read when needed (the writes
    # before each read go with it); the usage ledger's cursor (gpuadmin/usage/ledger.py); the last
    # writes; COMMIT; the kills app's look for memory to confirm, after the commit. Sending the three
    # reads behind the lock saved three of them but no CPU (benchmarks/README.md, "What each
    # performance mechanism is worth").
    assert counted == [9]
    assert ProcessLife.objects.get(pid=11).latest_sighting_at() == at(20)
