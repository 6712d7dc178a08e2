"""Snapshot updates applied a batch at a time (``updates.receive_snapshot_updates``): the same rows as
one by one, in a handful of statements, and every message not of the common case sent alone, in order."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gpuadmin.agent.snapshot_choice import Limits, choose
from gpuadmin.fleet import summary, synthetic
from gpuadmin.fleet.intake import updates
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.updates import receive_snapshot_update, receive_snapshot_updates
from gpuadmin.fleet.models import (
    Gpu,
    GpuSample,
    Host,
    HostSample,
    HostSummary,
    LatestSnapshot,
    ProcessLife,
    ProcessPoint,
    SnapshotRejection,
)
from gpuadmin.usage.models import LifeUsage, UsageCursor, UsageDay
from gpuadmin.wire.signing import MessageKind, generate_private_key, seal_text
from tests.fleet.helpers import T0

pytestmark = pytest.mark.django_db

HOSTS = 6
LIMITS = Limits(full_every_seconds=300, snapshot_max_bytes=8 * 2**20, update_max_bytes=256 * 1024,
                step_bytes=64 * 2**20)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def fleet(tmp_path: Path) -> list[synthetic.DemoHost]:
    """Synthetic hosts (busy GPUs, memory moving, zombies on some), enrolled with a full snapshot."""
    hosts = synthetic.demo_hosts(tmp_path, HOSTS, gpus=4, processes=40)
    for host in hosts:
        assert synthetic.send(host, 0, taken_at=at(0))
    return hosts


def rounds(hosts: list[synthetic.DemoHost], state_dir: Path, first: int, count: int) -> list[dict[str, Any]]:
    """The messages of ``count`` rounds from ``first``, each host's agent choosing; updates only."""
    messages = []
    for number in range(first, first + count):
        for host in hosts:
            taken_at = at(10 * number)
            choice = choose(host.document(number, taken_at=taken_at), host.key,
                            state_path=state_dir / f"{host.name}.json", now=taken_at.timestamp(),
                            limits=LIMITS, full_requested=number == 1)
            if number == 1:
                # The first round: full snapshots, so every later message is an update of its base.
                assert receive_snapshot(choice.message, received_at=taken_at) is not None
                continue
            assert choice.kind is MessageKind.SNAPSHOT_UPDATE
            messages.append(choice.message)
    return messages


def stored() -> dict[str, Any]:
    """Everything an update may write, without ids a rollback does not give back."""
    def rows(queryset: Any, *fields: str) -> list[tuple[Any, ...]]:
        return sorted(queryset.values_list(*fields), key=repr)

    return {
        "hosts": rows(Host.objects, "name", "last_seen_at", "last_snapshot_taken_at", "pids_in_use",
                      "process_count", "zombie_count", "last_error", "sampled_at", "sampled_zombie_count",
                      "sampled_pids_in_use"),
        "latest": rows(LatestSnapshot.objects, "host__name", "taken_at", "received_at", "update_sequence",
                       "update"),
        "gpus": rows(Gpu.objects, "host__name", "uuid", "memory_used_bytes", "memory_attributed_bytes",
                     "utilization_percent", "idle_since", "updated_at", "sampled_at",
                     "sampled_memory_used_bytes", "sampled_utilization_percent"),
        "gpu_samples": rows(GpuSample.objects, "gpu__uuid", "taken_at", "memory_used_bytes",
                            "utilization_percent"),
        "host_samples": rows(HostSample.objects, "host__name", "taken_at", "pids_in_use", "zombie_count"),
        "lives": rows(ProcessLife.objects, "host__name", "pid", "last_gpu_memory_bytes",
                      "peak_gpu_memory_bytes", "point_gpu_memory_bytes"),
        "points": rows(ProcessPoint.objects, "life__host__name", "life__pid", "taken_at", "gpu_memory_bytes"),
        "cursors": rows(UsageCursor.objects, "host__name", "taken_at", "clock_milliseconds", "devices",
                        "holder_bytes", "holders", "pending"),
        "usage": rows(UsageDay.objects, *[f.attname for f in UsageDay._meta.concrete_fields
                                          if not f.primary_key])
        + rows(LifeUsage.objects, *[f.attname for f in LifeUsage._meta.concrete_fields
                                    if not f.primary_key and f.attname != "life_id"]),
        # A summary's GPUs in the order the database aggregated them (the fleet page sorts them by index).
        "summaries": [tuple(sorted(v) if isinstance(v, list) else v for v in row) for row in
                      rows(HostSummary.objects, *[f.attname for f in HostSummary._meta.concrete_fields])],
        "refusals": rows(SnapshotRejection.objects, "host_name", "error"),
    }


def apply_one_by_one(messages: list[dict[str, Any]], received_at: datetime) -> None:
    for message in messages:
        with contextlib.suppress(updates.UpdateRefused):
            receive_snapshot_update(message, received_at=received_at)


def test_a_batch_stores_what_the_same_updates_one_by_one_store(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    messages = rounds(fleet, tmp_path, 1, 4)  # round 1 full, then 3 rounds of updates
    assert len(messages) == 3 * HOSTS
    received_at = at(60)
    with transaction.atomic():
        alone = transaction.savepoint()
        apply_one_by_one(messages, received_at)
        one_by_one = stored()
        transaction.savepoint_rollback(alone)
    before = stored()
    done: list[int] = []
    with CaptureQueriesContext(connection) as queries:
        for start in range(0, len(messages), HOSTS):  # a round a batch: one update per host
            receive_snapshot_updates(messages[start : start + HOSTS], received_at=received_at,
                                     done=lambda i, start=start: done.append(start + i))
    assert sorted(done) == list(range(len(messages)))
    assert stored() == one_by_one != before
    assert one_by_one["points"] and one_by_one["gpu_samples"] != before["gpu_samples"]
    # Three batches of six hosts: a handful of statements each, whatever the number of hosts.
    assert len(queries) <= 3 * 17


def test_bad_and_unfit_messages_go_alone_in_order_and_the_rest_are_applied_together(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    first, second = rounds(fleet, tmp_path, 1, 2), rounds(fleet, tmp_path, 3, 1)
    forged = seal_text(first[0]["text"], MessageKind.SNAPSHOT_UPDATE, generate_private_key())
    # Host 1's second update ahead of its first (a gap: refused alone, a full snapshot asked for), host 2's
    # second after its first in the same batch (applied alone, after the batch), a forged one, the rest.
    batch = [second[1], first[0], forged, first[2], second[2], *first[3:]]
    done: list[int] = []
    receive_snapshot_updates(batch, done=done.append, received_at=at(40))
    assert sorted(done) == list(range(len(batch)))
    sequences = dict(LatestSnapshot.objects.values_list("host__name", "update_sequence"))
    assert sequences[fleet[2].name] == 2  # both of host 2's, the second alone after the batch's
    assert sequences[fleet[0].name] == 1 and all(sequences[h.name] == 1 for h in fleet[3:])
    assert sequences[fleet[1].name] == 0  # its only update is the second: a gap
    errors = list(SnapshotRejection.objects.order_by("pk").values_list("host_name", "error"))
    assert [name for name, _ in errors] == [fleet[1].name, fleet[0].name]
    assert "missing" in errors[0][1] and "not by this host's accepted key" in errors[1][1]


def test_a_database_error_applies_none_of_the_batch_and_says_none_is_done(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    messages = rounds(fleet, tmp_path, 1, 2)
    before = stored()
    table = connection.ops.quote_name(HostSummary._meta.db_table)
    with connection.cursor() as cursor:
        # A real error from the database, at the batch's last statements (the summaries).
        cursor.execute(f"ALTER TABLE {table} RENAME TO gone")
    done: list[int] = []
    with pytest.raises(DatabaseError):
        receive_snapshot_updates(messages, done=done.append, received_at=at(30))
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE gone RENAME TO {table}")
    assert done == [] and stored() == before


def agent_messages(host: synthetic.DemoHost, state_path: Path, numbers: range, *,
                   full: bool = False) -> list[dict[str, Any]]:
    """What ``host``'s agent sends at rounds ``numbers`` (10 s apart), keeping its state in ``state_path``:
    the first a full snapshot when there is no state yet (or ``full``), the rest updates of it."""
    return [choose(host.document(number, taken_at=at(10 * number)), host.key, state_path=state_path,
                   now=at(10 * number).timestamp(), limits=LIMITS,
                   full_requested=full and number == numbers[0]).message for number in numbers]


def keeping(kept: dict[int, updates.OpenedUpdate]) -> updates.Wait:
    """A caller's ``wait`` that lets every update offered wait, keeping it in ``kept`` by its position."""
    def wait(index: int, opened: updates.OpenedUpdate) -> bool:
        kept[index] = opened
        return True
    return wait


def test_an_update_of_a_base_not_stored_yet_waits_for_it_and_the_hosts_later_ones_behind_it(
    fleet: list[synthetic.DemoHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = fleet[0]
    base, *later = agent_messages(host, tmp_path / "agent.json", range(1, 4))  # a full snapshot, 2 updates
    others = rounds(fleet[1:], tmp_path, 1, 2)
    kept: dict[int, updates.OpenedUpdate] = {}
    done: list[int] = []
    wait = keeping(kept)

    # The full snapshot is still in central's other queue: both updates wait, the second behind the first,
    # and nothing is refused or asked for; the other hosts' updates are applied.
    receive_snapshot_updates([*later, *others], done=done.append, received_at=at(35), wait=wait)
    assert sorted(kept) == [0, 1] and sorted(done) == list(range(2, 2 + len(others)))
    assert [opened.update.sequence for opened in kept.values()] == [1, 2]
    # Looked at, not given again; the host's progress: its last snapshot, the base stored before it.
    stored_base = LatestSnapshot.objects.get(host__name=host.name).base_digest
    assert stored_base != kept[0].update.base
    assert updates.waited_on([kept[0], kept[1]]) == [(at(0), (stored_base, 0))] * 2
    assert not SnapshotRejection.objects.exists()
    row = Host.objects.get(name=host.name)
    assert row.full_snapshot_requested_at is None and row.last_snapshot_taken_at == at(0)

    # Its base comes; then another of its updates, while the caller still keeps those: it waits behind
    # them, untried (tried, it would be refused: updates 1 and 2 of its base are not applied yet).
    assert receive_snapshot(base, received_at=at(36)) is not None
    # The first can now be decided; the second still waits for it.
    progress = updates.waited_on([kept[0], kept[1]])
    assert progress[0] is None and progress[1] == (at(10), (kept[0].update.base, 0))
    [third] = agent_messages(host, tmp_path / "agent.json", range(4, 5))
    kept_before = dict(kept)
    done.clear()
    receive_snapshot_updates([third], done=done.append, received_at=at(45), wait=wait, behind={host.name})
    assert done == [] and kept[0].update.sequence == 3
    assert not SnapshotRejection.objects.exists()

    # Given again as they were kept (not opened again), they are applied in order.
    monkeypatch.setattr(updates, "open_envelope", None)  # a second opening would raise
    receive_snapshot_updates([kept_before[0], kept_before[1], kept[0]], done=done.append, received_at=at(47),
                             wait=wait)
    assert done == [0, 1, 2]
    assert LatestSnapshot.objects.get(host__name=host.name).update_sequence == 3
    assert not SnapshotRejection.objects.exists()


def test_an_update_whose_earlier_ones_another_worker_holds_waits_for_them(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    host = fleet[0]
    # A full snapshot and two updates of it.
    base, first, second = agent_messages(host, tmp_path / "agent.json", range(1, 4))
    assert receive_snapshot(base, received_at=at(11)) is not None
    kept: dict[int, updates.OpenedUpdate] = {}
    wait = keeping(kept)

    # The second comes first (the first is in another worker's batch): it waits; nothing refused or asked.
    done: list[int] = []
    receive_snapshot_updates([second], done=done.append, received_at=at(35), wait=wait)
    assert done == [] and kept[0].update.sequence == 2
    assert not SnapshotRejection.objects.exists()
    assert Host.objects.get(name=host.name).full_snapshot_requested_at is None
    assert updates.waited_on([kept[0]]) == [(at(10), (kept[0].update.base, 0))]

    # The other worker applies the first; given again, the second applies after it.
    receive_snapshot_updates([first], done=done.append, received_at=at(36))
    assert updates.waited_on([kept[0]]) == [None]
    receive_snapshot_updates([kept[0]], done=done.append, received_at=at(37), wait=wait)
    assert done == [0, 0] and LatestSnapshot.objects.get(host__name=host.name).update_sequence == 2
    assert not SnapshotRejection.objects.exists()


def test_an_update_behind_its_hosts_earlier_one_waits_for_the_one_between_that_another_worker_holds(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    host = fleet[0]
    base, first, second, third = agent_messages(host, tmp_path / "agent.json", range(1, 5))
    assert receive_snapshot(base, received_at=at(11)) is not None
    kept: dict[int, updates.OpenedUpdate] = {}
    wait = keeping(kept)

    # The first and the third in one batch (given again together), the second in another worker's: the
    # first applies; the third, after it in the batch and so tried alone, waits for the second.
    done: list[int] = []
    receive_snapshot_updates([first, third], done=done.append, received_at=at(45), wait=wait)
    assert done == [0] and list(kept) == [1] and kept[1].update.sequence == 3
    assert not SnapshotRejection.objects.exists()
    assert Host.objects.get(name=host.name).full_snapshot_requested_at is None

    # The other worker applies the second; given again, the third applies after it.
    receive_snapshot_updates([second], done=done.append, received_at=at(46))
    receive_snapshot_updates([kept[1]], done=done.append, received_at=at(47), wait=wait)
    assert done == [0, 0, 0] and LatestSnapshot.objects.get(host__name=host.name).update_sequence == 3
    assert not SnapshotRejection.objects.exists()


def test_an_update_that_may_not_wait_longer_or_is_older_than_the_stored_snapshot_is_refused(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    host = fleet[0]
    _, update = agent_messages(host, tmp_path / "agent.json", range(1, 3))  # its base never arrives
    offered: list[int] = []
    opened_forms: list[updates.OpenedUpdate] = []

    def no_longer(index: int, opened: updates.OpenedUpdate) -> bool:
        offered.append(index)
        opened_forms.append(opened)
        return False

    done: list[int] = []
    receive_snapshot_updates([update], done=done.append, received_at=at(25), wait=no_longer)
    assert offered == [0] and done == [0]
    assert "unknown base" in SnapshotRejection.objects.get(host_name=host.name).error
    assert Host.objects.get(name=host.name).full_snapshot_requested_at == at(25)

    # A newer full snapshot is stored: an update of another base taken before it was overtaken, and
    # cannot be waiting for its base. Refused as late at once, never offered to wait, nothing asked.
    newer, *_ = agent_messages(host, tmp_path / "restarted-agent.json", range(4, 5), full=True)
    assert updates.waited_on(opened_forms) != [None]  # its base may still come
    assert receive_snapshot(newer, received_at=at(41)) is not None
    assert updates.waited_on(opened_forms) == [None]  # overtaken: decided at once
    offered.clear()
    receive_snapshot_updates([update], done=done.append, received_at=at(62), wait=no_longer)
    assert offered == [] and done == [0, 0]
    late = SnapshotRejection.objects.filter(host_name=host.name).latest("pk")
    assert "not newer than the latest snapshot" in late.error
    assert Host.objects.get(name=host.name).full_snapshot_requested_at == at(25)


def test_after_updates_the_whole_summary_recomputed_says_what_their_figures_refresh_left(
    fleet: list[synthetic.DemoHost], tmp_path: Path,
) -> None:
    messages = rounds(fleet, tmp_path, 1, 3)
    fields = [f.attname for f in HostSummary._meta.concrete_fields if f.attname != "updated_at"]

    def summaries() -> list[tuple[Any, ...]]:
        return sorted(HostSummary.objects.values_list(*fields))

    before = summaries()
    for start in range(0, len(messages), HOSTS):  # rounds 2 and 3, a round a batch
        receive_snapshot_updates(messages[start : start + HOSTS], done=lambda i: None,
                                 received_at=at(10 * (start // HOSTS + 2) + 1))
    assert set(LatestSnapshot.objects.values_list("update_sequence", flat=True)) == {2}
    left = summaries()
    assert left != before  # the figures moved
    summary.refresh_host_summaries([host.pk for host in Host.objects.all()], now=at(60))
    assert summaries() == left


def test_the_lives_an_update_names_are_read_by_their_identity_alone(fleet: list[synthetic.DemoHost]) -> None:
    # The hosts run the same pids: no other host's life with a named pid is read, nor a life of another
    # boot, nor one already over. More identities than one SQLite statement takes (200).
    columns = ("id", "host_id", "boot_id", "pid", "start_time_ticks")
    lives = list(ProcessLife.objects.filter(gone_at__isnull=True).order_by("id").values_list(*columns))
    assert len(lives) > 200 and len({life[3] for life in lives}) < len(lives)
    over = lives[0]
    ProcessLife.objects.filter(pk=over[0]).update(gone_at=at(5))
    host_id, boot_id, pid, start = lives[1][1:]
    elsewhere = [(host_id, "another-boot", pid, start), (host_id + 1000, boot_id, pid, start)]
    asked = [life[1:] for life in lives] + elsewhere

    found = updates._NAMED_OPEN_LIVES.rows(asked)

    assert sorted(row[:5] for row in found) == lives[1:]
