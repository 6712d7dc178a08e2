"""The ledger between full snapshots: a host that sends snapshot updates (gpuadmin/wire/snapshot_update.py)
is charged for every interval as if each were a full snapshot, through the real agent choice and both
ingest paths."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.usage.models import LifeUsage, UsageCursor
from gpuadmin.wire.signing import MessageKind
from tests.factories import GiB, proc
from tests.fleet.intake.test_updates import G0, G1, HOST, Agent, document
from tests.keys import accept

pytestmark = pytest.mark.django_db


def life(pid: int, device: str) -> tuple[int, int, int, int]:
    row = LifeUsage.objects.get(pid=pid, device_uuid=device)
    return row.held_milliseconds, row.held_byte_seconds, row.busy_milliseconds, row.idle_milliseconds


def test_updates_charge_time_utilisation_and_memory_as_full_snapshots_would(settings, tmp_path) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    accept(HOST)
    agent = Agent(tmp_path / "snapshot-choice.json")
    kinds = [
        agent.send(document(0, utilization=(50, 20))).kind,
        # Only figures move: updates. pid 101 grows to 12 GiB at t=10, GPU 0 idles from t=20.
        agent.send(document(10, big=12 * GiB, utilization=(100, 20))).kind,
        agent.send(document(20, big=12 * GiB, utilization=(0, 20))).kind,
        agent.send(document(30, big=12 * GiB, utilization=(0, 20)), full=True).kind,
    ]
    assert kinds == [MessageKind.SNAPSHOT, MessageKind.SNAPSHOT_UPDATE, MessageKind.SNAPSHOT_UPDATE,
                     MessageKind.SNAPSHOT]
    # pid 101 on GPU 0, alone: [0,10) 50 % at 10 GiB; [10,20) 100 % at 12 GiB; [20,30) idle at 12 GiB.
    assert life(101, G0) == (30_000, 10 * (10 + 12 + 12) * GiB, 15_000, 10_000)
    # pid 102 on GPU 1 at 20 % and 2 GiB throughout.
    assert life(102, G1) == (30_000, 30 * 2 * GiB, 6_000, 0)


def test_an_update_before_any_full_snapshot_charged_is_ignored_by_the_ledger(settings, tmp_path) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0
    settings.GPUADMIN_USAGE_LEDGER = False
    accept(HOST)
    agent = Agent(tmp_path / "snapshot-choice.json")
    agent.send(document(0))
    settings.GPUADMIN_USAGE_LEDGER = True  # the ledger turned on between a full snapshot and an update
    assert agent.send(document(10, big=12 * GiB)).kind is MessageKind.SNAPSHOT_UPDATE
    assert not LifeUsage.objects.exists()


def test_an_update_naming_a_process_writes_its_memory_not_the_lists_it_only_read(settings, tmp_path) -> None:
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 3600  # no settling between these snapshots
    accept(HOST)
    agent = Agent(tmp_path / "snapshot-choice.json")
    agent.send(document(0))
    before = UsageCursor.objects.get(host__name=HOST)
    with CaptureQueriesContext(connection) as queries:
        assert agent.send(document(10, big=12 * GiB)).kind is MessageKind.SNAPSHOT_UPDATE  # pid 101 named
    after = UsageCursor.objects.get(host__name=HOST)
    assert (after.holders, after.pending, after.holders_digest, after.holder_index) == (
        before.holders, before.pending, before.holders_digest, before.holder_index)
    assert after.holder_bytes != before.holder_bytes and after.clock_milliseconds == 10_000
    # pid 101 was looked up in the holders' index: the long list was not even read.
    cursor_reads = [q["sql"] for q in queries.captured_queries if 'FROM "usage_usagecursor"' in q["sql"]]
    assert len(cursor_reads) == 1 and '"holder_index"' in cursor_reads[0], cursor_reads
    assert '"usage_usagecursor"."holders"' not in cursor_reads[0]
    writes = [q["sql"] for q in queries.captured_queries
              if 'INSERT INTO "usage_usagecursor"' in q["sql"] or 'UPDATE "usage_usagecursor"' in q["sql"]]
    assert len(writes) == 1 and "INSERT" not in writes[0] and '"holders"' not in writes[0], writes


def test_an_update_finds_each_moved_holder_among_many_whatever_order_the_agent_listed_them(
    settings, tmp_path
) -> None:
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    settings.GPUADMIN_USAGE_FLUSH_SECONDS = 0

    def holders(*, p900: int, p7_on_g1: int) -> list[dict[str, Any]]:
        # Listed by falling pid; pid 7 holds on both GPUs.
        return [proc(pid, gpu_memory=memory, device_files=["/dev/nvidia0"], reasons=["gpu"])
                for pid, memory in ((900, {G0: p900}), (500, {G0: GiB}), (300, {G0: GiB}),
                                    (7, {G0: GiB, G1: p7_on_g1}))]

    accept(HOST)
    agent = Agent(tmp_path / "snapshot-choice.json")
    agent.send(document(0, extra=holders(p900=GiB, p7_on_g1=GiB)))
    moved = holders(p900=3 * GiB, p7_on_g1=5 * GiB)
    assert agent.send(document(10, extra=moved)).kind is MessageKind.SNAPSHOT_UPDATE
    agent.send(document(20, extra=moved), full=True)
    # 10 s at the first figure, 10 s at the update's.
    assert life(900, G0)[1] == 10 * (1 + 3) * GiB
    assert life(7, G1)[1] == 10 * (1 + 5) * GiB
    assert life(7, G0)[1] == life(500, G0)[1] == life(300, G0)[1] == 20 * GiB
