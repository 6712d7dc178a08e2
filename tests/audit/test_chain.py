"""Recording events builds a hash chain; verification recomputes it and names the first bad event."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from django.db import transaction

from gpuadmin.audit import log
from gpuadmin.audit.chain import GENESIS_HASH, canonical_encoding
from gpuadmin.audit.models import Action, AuditEvent
from tests.audit.helpers import audit_table, tamper

pytestmark = pytest.mark.django_db


def test_events_chain_from_64_zeros_and_verify(record_events):
    first, second, third = record_events(3)

    assert [e.sequence for e in (first, second, third)] == [1, 2, 3]
    assert first.previous_hash == GENESIS_HASH
    assert second.previous_hash == first.hash
    assert third.previous_hash == second.hash
    result = AuditEvent.objects.verify()
    assert result.ok
    assert result.events == 3
    assert (result.head_sequence, result.head_hash) == (3, third.hash)
    assert result.summary() == "audit chain OK: 3 events"


def test_empty_log_verifies():
    result = AuditEvent.objects.verify()
    assert result.ok
    assert result.events == 0
    assert result.head_sequence is None


def test_hash_is_sha256_of_the_documented_canonical_encoding(make_user):
    alice = make_user("alice")
    event = log.record(
        Action.APPROVED,
        actor=alice,
        kill_request_id=7,
        host_name="gpu-07",
        requester_name="bob",
        approver_name="alice",
        process_users=["carol", "dave", "carol"],
        targets_summary="pid 4120 python (carol) +2",
        details={"z": 1, "a": ["é", 2.5]},
    )
    stored = AuditEvent.objects.get(pk=event.pk)

    expected = json.dumps(
        {
            "action": "approved",
            "actor_name": "alice",
            "approver_name": "alice",
            "created_at": stored.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
            "details": {"a": ["é", 2.5], "z": 1},
            "host_name": "gpu-07",
            "kill_request_id": 7,
            "previous_hash": GENESIS_HASH,
            "process_users": "carol,dave",
            "requester_name": "bob",
            "sequence": 1,
            "targets_summary": "pid 4120 python (carol) +2",
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()
    assert b'"details":{"a":["\\u00e9",2.5],"z":1}' in expected
    assert stored.hash == hashlib.sha256(expected).hexdigest()
    assert stored.actor_name == "alice"
    assert stored.process_user_list == ["carol", "dave"]


def test_canonical_encoding_does_not_cover_the_actor_foreign_key():
    fields = {
        "sequence": 1,
        "created_at": datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        "actor_name": "alice",
        "action": "requested",
        "kill_request_id": None,
        "host_name": "h",
        "requester_name": "",
        "approver_name": "",
        "process_users": "",
        "targets_summary": "",
        "details_json": "{}",
        "previous_hash": GENESIS_HASH,
    }
    encoded = canonical_encoding(fields)
    assert b'"created_at":"2025-01-02T03:04:05.000006+00:00"' in encoded
    assert b"actor_id" not in encoded
    with pytest.raises(TypeError, match=r"not hashed \['actor_id'\]"):
        canonical_encoding({**fields, "actor_id": 3})
    with pytest.raises(TypeError, match=r"missing \['host_name'\]"):
        canonical_encoding({k: v for k, v in fields.items() if k != "host_name"})


def test_awkward_details_and_names_survive_the_database_round_trip(record_events):
    # jsonb would rewrite 1e16 and -0.0 and refuse \u0000; the log keeps exact text instead.
    awkward = {"big": 1e16, "negative_zero": -0.0, "nul": "a\x00b", "nested": {"k": [1, None, True]}}
    log.record(
        Action.SIGNAL_SENT,
        host_name="gpu\x00evil",
        targets_summary="pid 1 a\x00b",
        details=awkward,
    )
    event = AuditEvent.objects.get()
    assert event.details == awkward
    assert event.details_json == (
        '{"big":1e+16,"negative_zero":-0.0,"nested":{"k":[1,null,true]},"nul":"a\\u0000b"}'
    )
    assert event.host_name == "gpu\N{REPLACEMENT CHARACTER}evil"
    assert AuditEvent.objects.verify().ok


def test_unknown_action_and_unserialisable_details_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="unknown audit action 'nuked'"):
        log.record("nuked")
    with pytest.raises(ValueError, match="JSON-serialisable"):
        log.record(Action.REQUESTED, details={"when": datetime.now(UTC)})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        log.record(Action.REQUESTED, details={"ratio": float("nan")})
    assert not AuditEvent.objects.exists()


def test_an_event_rolls_back_with_the_change_it_describes_and_leaves_no_gap(record_events):
    record_events(1)
    with pytest.raises(RuntimeError), transaction.atomic():
        log.record(Action.APPROVED, kill_request_id=1)
        raise RuntimeError("the approval failed after the event was written")
    after = log.record(Action.REJECTED, kill_request_id=1)

    assert after.sequence == 2
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["requested", "rejected"]
    assert AuditEvent.objects.verify().ok


def test_summarize_targets():
    assert log.summarize_targets([]) == ""
    targets = [{"pid": 4120, "name": "python", "user": "alice"}, {"pid": 4121}, {"pid": 4122}]
    assert log.summarize_targets(targets[:1]) == "pid 4120 python (alice)"
    assert log.summarize_targets(targets) == "pid 4120 python (alice) +2"


def test_edited_content_is_a_hash_mismatch_at_that_event(record_events):
    record_events(5)
    tamper(f"UPDATE {audit_table()} SET host_name = %s WHERE sequence = 3", ("elsewhere",))

    result = AuditEvent.objects.verify()
    assert not result.ok
    assert result.first_bad_sequence == 3
    assert result.problem.startswith("hash mismatch")
    assert result.events == 5


def test_edited_and_rehashed_event_breaks_the_next_link(record_events):
    events = record_events(4)
    victim = events[1]
    forged = AuditEvent(
        sequence=victim.sequence,
        created_at=victim.created_at,
        actor_name="mallory",
        action=victim.action,
        kill_request_id=victim.kill_request_id,
        host_name=victim.host_name,
        previous_hash=victim.previous_hash,
        details_json=victim.details_json,
    ).computed_hash()
    tamper(
        f"UPDATE {audit_table()} SET actor_name = %s, hash = %s WHERE sequence = %s",
        ("mallory", forged, victim.sequence),
    )

    result = AuditEvent.objects.verify()
    assert not result.ok
    assert result.first_bad_sequence == 3
    assert result.problem == "broken link: previous_hash does not match the hash of event 2"


def test_details_that_are_no_longer_json_are_named(record_events):
    record_events(2)
    tamper(f"UPDATE {audit_table()} SET details_json = %s WHERE sequence = 2", ("{not json",))

    result = AuditEvent.objects.verify()
    assert (result.ok, result.first_bad_sequence) == (False, 2)
    assert "not valid JSON" in result.problem


def test_a_deleted_event_is_a_gap_named_by_its_sequence(record_events):
    record_events(5)
    tamper(f"DELETE FROM {audit_table()} WHERE sequence = 3")

    result = AuditEvent.objects.verify()
    assert not result.ok
    assert result.first_bad_sequence == 3
    assert result.problem == "gap in sequence: event 3 is missing (the next event present is 4)"
    assert result.events == 4


def test_deleted_first_events_are_a_gap_from_one(record_events):
    record_events(4)
    tamper(f"DELETE FROM {audit_table()} WHERE sequence <= 2")

    result = AuditEvent.objects.verify()
    assert result.first_bad_sequence == 1
    assert result.problem == "gap in sequence: events 1 to 2 are missing (the next event present is 3)"


def test_only_the_whole_log_is_verified(record_events):
    record_events(3)
    # A filter would turn the events it leaves out into "gaps": refuse rather than mislead.
    with pytest.raises(ValueError, match="whole audit log"):
        AuditEvent.objects.filter(sequence__gte=2).verify()
    with pytest.raises(ValueError, match="whole audit log"):
        AuditEvent.objects.all()[:2].verify()
    assert AuditEvent.objects.all().verify().ok


def test_links_are_checked_across_chunk_boundaries(record_events):
    events = record_events(5)
    forged = AuditEvent(
        sequence=2,
        created_at=events[1].created_at,
        action=events[1].action,
        kill_request_id=1,
        host_name="gpu1",
        actor_name="mallory",
        previous_hash=events[0].hash,
    ).computed_hash()
    tamper(f"UPDATE {audit_table()} SET actor_name = 'mallory', hash = %s WHERE sequence = 2", (forged,))

    result = AuditEvent.objects.verify(chunk_size=2)  # events 1-2 in the first chunk, 3-4 in the second
    assert (result.ok, result.first_bad_sequence) == (False, 3)
    assert result.events == 5


def test_the_chain_module_needs_no_django():
    # chain.py is the pure half: the model and its queryset feed it, never the other way round.
    code = "import sys, gpuadmin.audit.chain; sys.exit('django' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
