"""sync_findings: findings open, stay open with their first sighting, and resolve, by (kind, key)."""

from __future__ import annotations

import pytest

from gpuadmin.fleet.findings.rules import FindingDraft
from gpuadmin.fleet.findings.sync import sync_findings
from gpuadmin.fleet.models import Finding, Host
from tests.fleet.helpers import T0, at

pytestmark = pytest.mark.django_db

Kind = Finding.Kind
Severity = Finding.Severity


def zombies(parent: str, count: int) -> FindingDraft:
    return FindingDraft(
        kind=Kind.ZOMBIES,
        key=parent,
        severity=Severity.INFO,
        title=f"{count} zombies under {parent}",
        remedy="reap them",
    )


@pytest.fixture
def host() -> Host:
    return Host.objects.create(name="gpu01", first_seen_at=T0)


def open_titles(host: Host) -> list[str]:
    return sorted(host.findings.filter(resolved_at=None).values_list("title", flat=True))


def test_open_refresh_resolve(host: Host) -> None:
    result = sync_findings(host, [zombies("4120:1", 2), zombies("7000:1", 1)], at(0))
    assert (result.opened, result.refreshed, result.resolved) == (2, 0, 0)

    result = sync_findings(host, [zombies("4120:1", 5)], at(10))
    assert (result.opened, result.refreshed, result.resolved) == (0, 1, 1)
    kept = host.findings.get(key="4120:1")
    assert (kept.title, kept.first_seen_at, kept.last_seen_at, kept.resolved_at) == (
        "5 zombies under 4120:1",
        at(0),
        at(10),
        None,
    )
    assert host.findings.get(key="7000:1").resolved_at == at(10)
    assert open_titles(host) == ["5 zombies under 4120:1"]


def test_a_finding_that_comes_back_opens_a_new_episode(host: Host) -> None:
    sync_findings(host, [zombies("4120:1", 2)], at(0))
    sync_findings(host, [], at(10))
    sync_findings(host, [zombies("4120:1", 3)], at(20))
    episodes = list(host.findings.order_by("first_seen_at").values_list("first_seen_at", "resolved_at"))
    assert episodes == [(at(0), at(10)), (at(20), None)]


def test_findings_of_the_kills_app_are_never_touched(host: Host) -> None:
    unkillable = Finding.objects.create(
        host=host,
        kind=Kind.UNKILLABLE,
        key="4120:1",
        severity=Severity.CRITICAL,
        title="python survived SIGKILL",
        remedy="reboot",
        first_seen_at=T0,
        last_seen_at=T0,
    )
    result = sync_findings(host, [zombies("4120:1", 2)], at(10))
    unkillable.refresh_from_db()
    assert unkillable.resolved_at is None
    assert unkillable.last_seen_at == T0
    # What stays open, told to snapshot_ingested's receivers: the snapshot's kinds and the others'.
    assert result.open_kinds == {Kind.ZOMBIES, Kind.UNKILLABLE}
    assert sync_findings(host, [], at(20)).open_kinds == {Kind.UNKILLABLE}
    with pytest.raises(ValueError, match="not drawn from snapshots"):
        sync_findings(host, [FindingDraft(Kind.UNKILLABLE, "x", Severity.INFO, "t", "r")], at(20))


def test_findings_of_another_host_are_left_alone(host: Host) -> None:
    other = Host.objects.create(name="gpu02", first_seen_at=T0)
    sync_findings(other, [zombies("4120:1", 2)], at(0))
    sync_findings(host, [], at(10))
    assert other.findings.get().resolved_at is None


def test_severity_and_details_follow_the_latest_snapshot(host: Host) -> None:
    sync_findings(host, [zombies("4120:1", 2)], at(0))
    worse = FindingDraft(
        Kind.ZOMBIES, "4120:1", Severity.CRITICAL, "2000 zombies", "reap", {"zombie_count": 2000}
    )
    sync_findings(host, [worse], at(10))
    finding = host.findings.get()
    assert (finding.severity, finding.details) == (Severity.CRITICAL, {"zombie_count": 2000})


def test_long_text_is_clipped_to_the_columns() -> None:
    draft = FindingDraft(Kind.ZOMBIES, "k" * 500, Severity.INFO, "t" * 1000, "r" * 1000)
    assert (len(draft.key), len(draft.title), len(draft.remedy)) == (200, 300, 500)
    assert draft.title.endswith("…")
