"""The fleet's named queries (gpuadmin/fleet/models.py querysets), which pages, API and kills share."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpuadmin.fleet.findings.rules import FindingDraft
from gpuadmin.fleet.findings.sync import sync_findings
from gpuadmin.fleet.models import Finding, Host, LatestSnapshot
from tests.factories import gpu, proc, snapshot
from tests.fleet.helpers import T0, at

pytestmark = pytest.mark.django_db


def test_before_a_hosts_first_snapshot_there_is_no_latest_snapshot_nor_document() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=T0)
    assert LatestSnapshot.objects.for_host(host) is None
    assert LatestSnapshot.objects.document_for(host) is None
    assert LatestSnapshot.objects.documents_by_host_id({host.pk}) == {}


def test_the_latest_snapshot_and_document_are_the_newest_stored_for_that_host(
    ingest: Callable[..., Host],
) -> None:
    ingest(snapshot("gpu01", processes=[proc(10)], taken_at=at(0)))
    host = ingest(snapshot("gpu01", processes=[proc(11)], taken_at=at(10)))
    other = ingest(snapshot("gpu02", processes=[proc(20)], taken_at=at(10)))

    assert LatestSnapshot.objects.for_host(host).taken_at == at(10)
    document = LatestSnapshot.objects.document_for(host)
    assert [p["pid"] for p in document["processes"]] == [11]
    by_host = LatestSnapshot.objects.documents_by_host_id({host.pk, other.pk})
    pids = {pk: [p["pid"] for p in d["processes"]] for pk, d in by_host.items()}
    assert pids == {host.pk: [11], other.pk: [20]}


def test_listing_hosts_takes_two_queries_however_many_hosts_and_gpus(ingest: Callable[..., Host]) -> None:
    for index in range(5):
        ingest(snapshot(f"gpu{index:02d}", gpus=[gpu(0), gpu(1)], taken_at=at(index)))
    with CaptureQueriesContext(connection) as queries:
        hosts = list(Host.objects.for_listing())
        gpus_per_host = [[g.index for g in h.present_gpus] for h in hosts]
    assert len(queries) == 2
    assert gpus_per_host == [[0, 1]] * 5
    assert Host.objects.for_listing().named("gpu03").name == "gpu03"
    assert Host.objects.for_listing().named("nowhere") is None


def test_open_findings_are_counted_per_severity_and_listed_most_severe_first() -> None:
    host = Host.objects.create(name="gpu01", first_seen_at=T0)
    drafts = [
        FindingDraft(kind=Finding.Kind.ZOMBIES, key="1:1", severity=Finding.Severity.INFO, title="zombies",
                     remedy="reap"),
        FindingDraft(kind=Finding.Kind.ORPHAN_GPU, key="2:1", severity=Finding.Severity.CRITICAL,
                     title="orphan", remedy="kill"),
        FindingDraft(kind=Finding.Kind.PID_EXHAUSTION, key="pids", severity=Finding.Severity.WARNING,
                     title="pids", remedy="raise pid_max"),
    ]
    sync_findings(host, drafts, at(0))
    sync_findings(host, drafts[1:], at(10))  # the zombies are reaped: resolved, no longer open

    listed = Host.objects.for_listing().named("gpu01")
    counts = {s: getattr(listed, f"open_findings_{s}") for s in ("critical", "warning", "info")}
    assert counts == {"critical": 1, "warning": 1, "info": 0}
    assert [f.title for f in host.findings.open().most_severe_first()] == ["orphan", "pids"]
