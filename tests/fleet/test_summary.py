"""A host's summary (``HostSummary``, what the fleet page reads) is kept right wherever what it sums
changes: real signed snapshots and updates, a finding closed by the kills app; online or offline is read
from the clock, never stored."""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from gpuadmin.fleet import summary as summary_module
from gpuadmin.fleet.models import Finding, Host, HostSummary, ProcessLife
from gpuadmin.fleet.summary import TopHolder, refresh_host_summary, top_holder_may_change
from gpuadmin.fleet.tasks import maintain_history_task
from gpuadmin.kills import services
from gpuadmin.web.attention import AttentionCount
from gpuadmin.web.fleet_page import STATUS_OFFLINE, FleetQuery, FleetSummary
from gpuadmin.wire.signing import MessageKind
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import busy_host_gpus, busy_host_processes, make_offline, store
from tests.fleet.intake.test_updates import G1 as UPDATED_GPU1
from tests.fleet.intake.test_updates import HOST as UPDATED_HOST
from tests.fleet.intake.test_updates import Agent, document
from tests.keys import accept

pytestmark = pytest.mark.django_db


def summary_of(name: str) -> HostSummary:
    return HostSummary.objects.get(host__name=name)


def open_counts(host: Host) -> tuple[int, int, int]:
    return tuple(host.findings.open().filter(severity=severity).count()  # type: ignore[return-value]
                 for severity in ("critical", "warning", "info"))


def test_a_snapshot_writes_the_summary_and_the_next_one_rewrites_it():
    host = store("gpu01", processes=busy_host_processes(),
                 gpus=[*busy_host_gpus(), gpu(2, used=0, name="NVIDIA H100")])
    summary = summary_of("gpu01")
    assert summary.gpu_count == 3 and summary.free_gpu_count == 1
    assert [g[:3] for g in sorted(summary.gpus)] == [[0, 80 * GiB, 30 * GiB], [1, 80 * GiB, 10 * GiB],
                                             [2, 80 * GiB, 0]]
    assert [g[4] for g in sorted(summary.gpus)][:2] == [97, 40]
    assert summary.memory_used_bytes == 40 * GiB and summary.memory_unattributed_bytes == 4 * GiB
    assert summary.orphan_count == 2 and summary.top_holder_user == "alice"
    assert (summary.findings_critical_count, summary.findings_warning_count,
            summary.findings_info_count) == open_counts(host)
    worst = host.findings.open().get(severity="critical")
    assert (summary.worst_finding_rank, summary.worst_finding_severity, summary.worst_finding_title) == (
        0, "critical", worst.title)
    assert "\nNVIDIA H100\n" in summary.gpu_models

    # The orphans and zombies gone, a GPU freed: the same row, rewritten.
    store("gpu01", taken_at=timezone.now() + timedelta(seconds=10),
          processes=[proc(102, user="bob", gpu_memory={"GPU-sim-0001": 8 * GiB}, reasons=["gpu"])],
          gpus=[gpu(0, used=0), gpu(1, used=10 * GiB)])
    summary = summary_of("gpu01")
    assert summary.gpu_count == 2 and summary.free_gpu_count == 1
    assert summary.orphan_count == 0 and summary.top_holder_user == "bob"
    assert summary.findings_critical_count == 0 and summary.worst_finding_severity != "critical"
    assert HostSummary.objects.count() == 1


def test_a_finding_the_kills_app_closes_leaves_the_summary():
    host = store("gpu01", processes=[proc(4300, user="erin", gpu_memory={"GPU-sim-0000": 2 * GiB},
                                          reasons=["gpu"])])
    now = timezone.now()
    Finding.objects.create(host=host, kind=Finding.Kind.UNKILLABLE, key="4300:1", severity="critical",
                           title="PID 4300 survived SIGKILL", remedy="r",
                           details={"pid": 4300, "start_time_ticks": 1}, first_seen_at=now, last_seen_at=now)
    # The next snapshot counts it into the summary (the kills app looks at it after the commit, which a
    # test's transaction never reaches).
    store("gpu01", taken_at=now + timedelta(seconds=10))
    assert summary_of("gpu01").worst_finding_title == "PID 4300 survived SIGKILL"
    # The kills app closes it (its process gone): the summary no longer names it, with no snapshot since.
    assert services.resolve_gone_unkillable(host, snapshot("gpu01")) == 1
    summary = summary_of("gpu01")
    assert summary.findings_critical_count == 0
    assert summary.worst_finding_title != "PID 4300 survived SIGKILL"


def test_an_update_rewrites_the_summarys_gpu_figures(tmp_path: Path):
    accept(UPDATED_HOST)
    agent = Agent(tmp_path / "state.json")
    assert agent.send(document(0)).kind is MessageKind.SNAPSHOT
    assert [g[2] for g in sorted(summary_of(UPDATED_HOST).gpus)] == [11 * GiB, 3 * GiB]
    assert agent.send(document(10, big=20 * GiB, used=(21, 0), utilization=(90, 0))).kind is \
        MessageKind.SNAPSHOT_UPDATE
    summary = summary_of(UPDATED_HOST)
    assert [(g[2], g[4]) for g in sorted(summary.gpus)] == [(21 * GiB, 90), (0, 0)]
    assert summary.free_gpu_count == 1 and summary.memory_used_bytes == 21 * GiB


@pytest.mark.parametrize(("moved", "may_change"), [
    ([], False),
    ([(7, 3 * GiB)], False),  # another life, still under the top
    ([(7, 3 * GiB), (8, 9 * GiB)], True),  # another holds as much now: it may have the lower pid
    ([(5, 9 * GiB)], True),  # the top's own memory moved, up
    ([(5, 1 * GiB)], True),  # and down: another life may be the top now
])
def test_the_top_holder_is_recomputed_only_where_moved_memory_may_change_it(moved, may_change):
    assert top_holder_may_change(TopHolder(5, 9 * GiB), moved) is may_change
    # No life held GPU memory: any that holds some now is the top; none without a summary.
    assert top_holder_may_change(TopHolder(None, 0), [(7, 0)]) is False
    assert top_holder_may_change(TopHolder(None, 0), [(7, 1)]) is True
    assert top_holder_may_change(None, [(7, 1)]) is False


def test_an_update_recomputes_the_top_holder_where_it_may_have_changed_and_only_there(tmp_path: Path):
    accept(UPDATED_HOST)
    agent = Agent(tmp_path / "state.json")

    def sent(seconds: int, *, alice: int, bob: int) -> None:
        # alice's pid 101 on GPU 0, her pid 102 (2 GiB) on GPU 1 and bob's pid 103 there too.
        bobs = proc(103, user="bob", gpu_memory={UPDATED_GPU1: bob * GiB}, reasons=["gpu"])
        doc = document(seconds, big=alice * GiB, used=(alice + 1, bob + 3), extra=[bobs])
        assert agent.send(doc).kind is (MessageKind.SNAPSHOT if seconds == 0 else MessageKind.SNAPSHOT_UPDATE)

    def top() -> tuple[str, int, int]:
        s = summary_of(UPDATED_HOST)
        life = ProcessLife.objects.get(pk=s.top_holder_life_id)
        return s.top_holder_user, life.pid, s.top_holder_memory_bytes

    sent(0, alice=10, bob=4)
    assert top() == ("alice", 101, 10 * GiB)
    sent(10, alice=10, bob=12)  # bob's grows past hers
    assert top() == ("bob", 103, 12 * GiB)
    sent(20, alice=10, bob=1)  # his shrinks: hers, which the update does not name, is the top again
    assert top() == ("alice", 101, 10 * GiB)
    # A summary marked as if stale: an update that cannot change the top holder leaves it, one that can
    # recomputes it (what the row says is then what the lives say).
    HostSummary.objects.filter(host__name=UPDATED_HOST).update(top_holder_user="stale")
    sent(30, alice=10, bob=2)
    assert summary_of(UPDATED_HOST).top_holder_user == "stale"
    sent(40, alice=11, bob=2)
    assert top() == ("alice", 101, 11 * GiB)


def test_the_migration_that_keeps_the_top_holders_life_fills_it_as_a_refresh_would():
    store("gpu01", processes=busy_host_processes(), gpus=busy_host_gpus())
    store("gpu02", processes=[proc(7, gpu_memory={}, reasons=["gpu"])])  # nobody holds GPU memory
    columns = ("host__name", "top_holder_user", "top_holder_life_id", "top_holder_memory_bytes")
    refreshed = sorted(HostSummary.objects.values_list(*columns))
    assert refreshed[0][2] is not None and refreshed[1][1:] == ("", None, 0)
    HostSummary.objects.update(top_holder_life_id=None, top_holder_memory_bytes=0)  # as the new columns
    fill = importlib.import_module("gpuadmin.fleet.migrations.0023_summary_top_holder_life")._FILL
    with connection.cursor() as cursor:
        cursor.execute(fill)
    assert sorted(HostSummary.objects.values_list(*columns)) == refreshed


def test_offline_is_read_from_the_clock_not_from_the_summary():
    store("gpu01")
    summary_written = summary_of("gpu01").updated_at
    now = timezone.now()
    later = now + Host.offline_after() + timedelta(seconds=1)
    assert FleetSummary.of_fleet(now).hosts_offline == 0
    assert AttentionCount.of_fleet(now).offline_hosts == 0
    # Nothing written since: only time passed.
    assert FleetSummary.of_fleet(later).hosts_offline == 1
    assert AttentionCount.of_fleet(later).offline_hosts == 1
    assert not Host.objects.offline(now).exists() and Host.objects.offline(later).get() == Host.objects.get()
    assert list(FleetQuery(status=STATUS_OFFLINE).page_of_hosts(later)) == [Host.objects.get().pk]
    assert list(FleetQuery(needs_attention=True).page_of_hosts(later)) == [Host.objects.get().pk]
    assert summary_of("gpu01").updated_at == summary_written


def test_a_host_stored_before_summaries_gets_one_from_the_maintenance_beat():
    host = make_offline(store("gpu01", processes=busy_host_processes(), gpus=busy_host_gpus()))
    HostSummary.objects.filter(host=host).delete()  # as after the upgrade that added summaries
    assert maintain_history_task.apply().get()["summaries_filled"] == 1
    assert summary_of("gpu01").gpu_count == len(busy_host_gpus())
    assert maintain_history_task.apply().get()["summaries_filled"] == 0


@pytest.mark.postgres
def test_one_hosts_summary_is_not_planned_again_at_every_snapshot():
    # Its UPDATE of some fifteen subqueries cost more to plan than to run: the plan for any host,
    # prepared once per connection, must be the one used after PostgreSQL's first five runs (each
    # run's own plan, to compare with). pg_prepared_statements counts this session's plans of each.
    hosts = [store(f"gpu0{n}", processes=busy_host_processes(), gpus=busy_host_gpus()) for n in (1, 2)]
    for _ in range(6):
        for host in hosts:
            refresh_host_summary(host.pk)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                       "WHERE statement LIKE 'UPDATE \"fleet_hostsummary\" SET \"gpus\"%%'")
        # The connection outlives a test: statements for several hosts (= ANY) may be there from others.
        plans = [(generic, custom) for statement, generic, custom in cursor.fetchall()
                 if "ANY(" not in statement]
    assert len(plans) == 1, plans  # one statement for one host's whole row, whichever host
    generic, custom = plans[0]
    assert custom <= 5 and generic + custom >= 14, plans  # 2 snapshots and 12 refreshes, at least
    assert summary_of("gpu02").gpu_count == len(busy_host_gpus())


@pytest.mark.postgres
@pytest.mark.parametrize("statement", ["_ONE_SUMMARY_UPDATE", "_ONE_DETAILS_UPDATE", "_FIGURES_UPDATE"])
def test_a_summary_statement_stays_within_what_psycopg_keeps_parsed(statement: str):
    # psycopg parses a statement's text for its parameters again at every run when it is longer than
    # 4,096 characters or has more than 50 parameters (psycopg/_queries.py, MAX_CACHED_STATEMENT_*):
    # each full snapshot runs the first two.
    compiled = getattr(summary_module, statement)._compile("default")
    assert len(compiled.sql) <= 4096 and len(compiled.params) <= 50, (len(compiled.sql), len(compiled.params))
