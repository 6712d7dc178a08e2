"""manage.py demo_fleet: synthetic hosts through the signed, accepted ingest path."""

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.fleet import synthetic
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.models import Finding, Gpu, Host, LatestSnapshot
from gpuadmin.wire.signing import canonical_json, public_key_text

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("demo_fleet", *args, stdout=out)
    return out.getvalue()


def test_hosts_are_signed_offered_accepted_and_stored():
    output = run("--hosts", "12", "--gpus", "4", "--processes", "40")
    assert "round 0: 12 snapshots" in output
    hosts = list(Host.objects.order_by("name"))
    assert [h.name for h in hosts] == [f"demo-{n:04d}" for n in range(12)]
    expected = {h.name: h for h in synthetic.demo_hosts(settings.DATA_DIR, 12, gpus=4, processes=40)}
    for host in hosts:
        assert host.key_accepted
        assert host.public_key == public_key_text(expected[host.name].key)
        assert host.last_snapshot_taken_at is not None
    accepted = AuditEvent.objects.filter(action=Action.HOST_ACCEPTED).values_list("host_name", flat=True)
    assert sorted(accepted) == [h.name for h in hosts]
    assert Gpu.objects.filter(present=True).count() == 12 * 4
    assert all(len(s.document["processes"]) == 40 for s in LatestSnapshot.objects.all())


def test_the_fleet_has_zombies_orphans_and_unattributed_memory():
    run("--hosts", "12", "--gpus", "4", "--processes", "40")
    kinds = set(Finding.objects.open().values_list("kind", flat=True))
    assert {Finding.Kind.ZOMBIES, Finding.Kind.ORPHAN_GPU, Finding.Kind.UNATTRIBUTED_MEMORY} <= kinds


def test_every_document_is_valid_and_the_same_processes_come_back_each_round():
    host = synthetic.demo_hosts(settings.DATA_DIR, 1, processes=200)[0]
    first, second = host.document(0), host.document(1)
    parse_snapshot(canonical_json(first))
    parse_snapshot(canonical_json(second))
    assert len(first["processes"]) == 200
    assert [(p["pid"], p["start_time_ticks"]) for p in first["processes"]] == \
        [(p["pid"], p["start_time_ticks"]) for p in second["processes"]]
    assert first["gpus"] != second["gpus"]  # the figures move


def test_follow_sends_a_fresh_snapshot_per_host_each_round_and_a_rerun_signs_as_the_same_hosts():
    run("--hosts", "2", "--processes", "20")
    before = {h.name: h.last_snapshot_taken_at for h in Host.objects.all()}
    output = run("--hosts", "2", "--processes", "20", "--follow", "--interval", "0", "--rounds", "2")
    assert "round 1: 2 snapshots" in output
    for host in Host.objects.all():
        assert host.last_snapshot_taken_at > before[host.name]
    assert AuditEvent.objects.filter(action=Action.HOST_ACCEPTED).count() == 2  # accepted once


def test_a_host_name_taken_by_another_key_is_refused_with_what_to_do():
    run("--hosts", "1", "--processes", "20")
    (settings.DATA_DIR / synthetic.DEMO_FLEET_KEY).unlink()  # another data directory's demo, say
    with pytest.raises(CommandError, match="forget_host_key demo-0000"):
        run("--hosts", "1", "--processes", "20")


def test_a_snapshot_can_be_sent_as_taken_at_a_given_moment_enrolment_included():
    # benchmarks/ingest_side_by_side.py dates a whole run in the past, 10 s between rounds.
    host = synthetic.demo_hosts(settings.DATA_DIR, 1, processes=20)[0]
    enrolled_at = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    assert synthetic.send(host, 0, taken_at=enrolled_at)
    assert synthetic.send(host, 1, taken_at=enrolled_at + timedelta(seconds=10))
    stored = Host.objects.get(name=host.name)
    assert stored.last_snapshot_taken_at == enrolled_at + timedelta(seconds=10)
    # Both stored at their own moments: the first wrote the host's first sample (a later one writes
    # one only when a figure moved or the last is a minute old: history/record.py).
    assert stored.samples.order_by("taken_at").first().taken_at == enrolled_at
    assert all(s.taken_at in (enrolled_at, enrolled_at + timedelta(seconds=10)) for s in stored.samples.all())


def test_a_database_without_tables_is_refused_with_what_to_set(monkeypatch):
    from django.db import connection

    monkeypatch.setattr(connection.introspection, "table_names", lambda *args, **kwargs: [])
    with pytest.raises(CommandError, match="has no tables yet: start `make demo` or `make run` once") as no:
        run("--hosts", "1")
    assert "or set GPUADMIN_DATA_DIR to the data directory of the running panel" in str(no.value)
    assert not Host.objects.exists()
