"""Anchors (gpuadmin/audit/anchors.py): the chain's head signed with central's key, kept outside the
database, and the table checked against them; a database writer who rewrites history and recomputes
every later hash is caught."""

from __future__ import annotations

import json
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from gpuadmin.audit import anchors, log
from gpuadmin.audit.chain import event_hash
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.audit.tasks import anchor as anchor_task
from gpuadmin.wire.signing import MessageKind, canonical_json, generate_private_key, seal
from tests.audit.helpers import audit_table, tamper

pytestmark = pytest.mark.django_db


def run_verify(*args: str) -> str:
    out = StringIO()
    call_command("verify_audit", *args, stdout=out)
    return out.getvalue()


def approvals(count: int) -> list[AuditEvent]:
    return [log.record(Action.APPROVED, kill_request_id=n, host_name="gpu1", requester_name="alice",
                       approver_name="bob") for n in range(1, count + 1)]


def rewrite_from(sequence: int, **changes: str) -> None:
    """What a database writer does: change one event, then recompute it and every later hash, in SQL."""
    rows = list(AuditEvent.objects.filter(sequence__gte=sequence).order_by("sequence"))
    previous = AuditEvent.objects.filter(sequence=sequence - 1).values_list("hash", flat=True).first()
    for row in rows:
        fields = row.hashed_fields()
        if row.sequence == sequence:
            fields.update(changes)
        fields["previous_hash"] = previous or "0" * 64
        new_hash = event_hash(fields)
        assignments = ", ".join(f"{name} = %s" for name in changes) if row.sequence == sequence else ""
        values = tuple(changes.values()) if row.sequence == sequence else ()
        tamper(f"UPDATE {audit_table()} SET {assignments + ', ' if assignments else ''}"
               "previous_hash = %s, hash = %s WHERE sequence = %s",
               (*values, fields["previous_hash"], new_hash, row.sequence))
        previous = new_hash


def test_a_rewritten_and_rehashed_approval_passes_the_chain_but_fails_against_the_anchors(anchor_file):
    approvals(16)
    assert anchors.publish().sequence == 16
    approvals(9)  # events 17 to 25
    assert anchors.publish().sequence == 25
    assert run_verify().startswith("audit chain OK: 25 events\nanchors OK: 2 anchors agree")

    rewrite_from(17, approver_name="mallory")

    assert AuditEvent.objects.verify().ok  # the chain alone: every row agrees with the next
    with pytest.raises(CommandError) as failed:
        run_verify()
    message = str(failed.value)
    assert message.startswith("audit chain OK: 25 events\naudit chain FAILED against anchors: event 25 has")
    assert "one or more of events 17 to 25 changed after that anchor" in message
    assert "events up to 16 are as the anchor of event 16 written at" in message


def test_anchors_in_between_narrow_the_changed_events_down(anchor_file):
    approvals(20)
    anchors.publish()
    for _ in range(5):  # an anchor after each of events 21 to 25
        approvals(1)
        anchors.publish()
    rewrite_from(23, approver_name="mallory")

    result = anchors.check(anchors.read([anchor_file]))
    assert (result.ok, result.first_bad_sequence) == (False, 23)
    assert "one or more of events 23 to 23 changed" in result.lines[0]


def test_a_cut_tail_is_named_by_the_anchor_that_saw_it(anchor_file):
    approvals(6)
    anchors.publish()
    tamper(f"DELETE FROM {audit_table()} WHERE sequence >= 5")

    assert AuditEvent.objects.verify().ok
    with pytest.raises(CommandError, match=r"event 6 is gone \(the log now ends at 4\).*the log was cut"):
        run_verify()


def test_a_forged_anchor_line_is_reported_not_trusted(anchor_file):
    events = approvals(3)
    anchors.publish()
    rewrite_from(2, approver_name="mallory")
    # The writer "re-anchors" with a key of their own: reported, and the real anchor still fails.
    forged = seal(anchors.anchor_body(3, AuditEvent.objects.get(sequence=3).hash, events[0].created_at),
                  MessageKind.AUDIT_ANCHOR, generate_private_key())
    with open(anchor_file, "a") as file:
        file.write(canonical_json(forged) + "\n")

    result = anchors.check(anchors.read([anchor_file]))
    assert not result.ok
    assert result.lines[0].startswith(
        f"forged or malformed anchor, not trusted: {anchor_file} line 2: signed by")
    assert "FAILED against anchors: event 3" in result.lines[1]


def test_an_anchor_read_from_a_saved_log_counts(anchor_file, tmp_path, caplog):
    approvals(2)
    with caplog.at_level(logging.INFO, logger="gpuadmin.audit.anchors"):
        anchors.publish()
    journal = tmp_path / "journal.txt"
    logged = "".join(f"Dec 04 20:31:01 central celery[12]: {r.getMessage()}\n" for r in caplog.records)
    journal.write_text("Dec 04 20:31:00 central celery[12]: unrelated line\n" + logged)
    anchor_file.unlink()  # the file is gone; the journal still vouches

    output = run_verify("--anchor-file", str(journal))
    assert "no anchors in" not in output
    assert "anchors OK: 1 anchors agree; events up to 2" in output


def test_without_anchors_it_says_so_and_fails_only_when_they_are_required(anchor_file):
    approvals(2)
    assert "nothing outside the database vouches for this chain" in run_verify()
    with pytest.raises(CommandError, match="no anchors in"):
        run_verify("--require-anchors")


def test_events_after_the_newest_anchor_are_said_to_rest_on_the_database_alone(anchor_file):
    approvals(2)
    anchors.publish()
    approvals(3)
    assert "events 3 to 5 are newer than every anchor: the database alone vouches for them" in run_verify()


def test_publishing_anchors_only_a_head_that_verifies_from_the_last_anchor(anchor_file, caplog):
    approvals(3)
    assert anchor_task.apply().get() == 3
    assert anchor_task.apply().get() is None  # nothing new: no line written
    assert len(anchor_file.read_text().splitlines()) == 1
    approvals(2)
    tamper(f"UPDATE {audit_table()} SET approver_name = 'mallory' WHERE sequence = 4")

    with caplog.at_level(logging.ERROR):
        assert anchor_task.apply().get() is None
    assert "not anchored: audit chain BROKEN at event 4" in caplog.text
    assert len(anchor_file.read_text().splitlines()) == 1


def test_an_anchor_line_is_central_signed_json(anchor_file):
    from gpuadmin.keys import central_public_key
    from gpuadmin.wire.signing import open_envelope

    approvals(1)
    anchors.publish()
    envelope = json.loads(anchor_file.read_text())
    body = open_envelope(envelope, MessageKind.AUDIT_ANCHOR, trusted=central_public_key()).body()
    assert body["sequence"] == 1 and body["hash"] == AuditEvent.objects.get().hash
    assert anchor_file.stat().st_mode & 0o077 == 0


def test_the_newest_anchor_is_found_in_the_tail_of_a_long_file(anchor_file):
    from gpuadmin.keys import central_public_key

    approvals(1)
    anchors.publish()
    first_line = anchor_file.read_text()
    approvals(1)
    with open(anchor_file, "a") as file:
        file.write(first_line * 300)  # ~100 KiB of older anchors: more than the tail that is read
    second = anchors.publish()

    assert anchor_file.stat().st_size > anchors.TAIL_BYTES
    found = anchors.newest(anchor_file, trusted=central_public_key())
    assert (found.sequence, found.hash) == (second.sequence, second.hash)
    assert found.anchored_at == second.anchored_at
    assert anchors.publish() is None  # nothing new since the newest
