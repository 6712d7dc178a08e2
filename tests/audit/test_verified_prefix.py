"""The audit page re-hashes only past the prefix its process verified (gpuadmin/audit/verified_prefix.py).

What it promises: new events are recomputed on every load; the prefix was
recomputed in full at most FULL_VERIFY_EVERY_SECONDS ago and its newest event
still has the same hash; `verify_audit` always recomputes everything.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from gpuadmin.audit import verified_prefix
from gpuadmin.audit.verified_prefix import FULL_VERIFY_EVERY_SECONDS, verify_for_page
from tests.audit.helpers import audit_table, tamper

pytestmark = pytest.mark.django_db


def test_a_second_load_recomputes_only_the_new_events(record_events):
    record_events(5)
    first = verify_for_page(now=1000.0)
    assert (first.full, first.result.ok, first.result.events) == (True, True, 5)
    events = record_events(2)
    second = verify_for_page(now=1001.0)
    assert (second.full, second.recomputed_after) == (False, 5)
    assert (second.result.ok, second.result.events) == (True, 7)
    assert (second.result.head_sequence, second.result.head_hash) == (7, events[-1].hash)


def test_a_bad_new_event_is_found_at_once(record_events):
    record_events(3)
    verify_for_page(now=1000.0)
    record_events(2)
    tamper(f"UPDATE {audit_table()} SET host_name = 'elsewhere' WHERE sequence = 5")
    check = verify_for_page(now=1001.0)
    assert not check.result.ok
    assert check.result.first_bad_sequence == 5


def test_a_cut_or_rewritten_tail_is_found_at_once_and_stays_found(record_events):
    record_events(4)
    verify_for_page(now=1000.0)
    tamper(f"UPDATE {audit_table()} SET hash = %s WHERE sequence = 4", ("f" * 64,))
    check = verify_for_page(now=1001.0)
    assert not check.result.ok
    assert check.result.first_bad_sequence == 4
    assert "verified earlier with hash" in check.result.problem
    # Even the next full check keeps saying so: this process saw event 4 as it was.
    later = verify_for_page(now=1001.0 + FULL_VERIFY_EVERY_SECONDS)
    assert not later.result.ok


def test_an_older_event_changed_in_place_shows_in_the_next_full_check_and_in_verify_audit(record_events):
    record_events(4)
    verify_for_page(now=1000.0)
    tamper(f"UPDATE {audit_table()} SET approver_name = 'mallory' WHERE sequence = 2")
    # Inside the window the page does not re-read event 2, and says what it did check.
    quick = verify_for_page(now=1010.0)
    assert quick.result.ok and not quick.full and quick.recomputed_after == 4
    with pytest.raises(CommandError, match="audit chain BROKEN at event 2: hash mismatch"):
        call_command("verify_audit")
    full = verify_for_page(now=1000.0 + FULL_VERIFY_EVERY_SECONDS)
    assert full.full
    assert (full.result.ok, full.result.first_bad_sequence) == (False, 2)


def test_the_page_says_what_it_recomputed(viewer_client: Client, record_events):
    record_events(3)
    first = viewer_client.get(reverse("audit_log")).content.decode()
    assert "Chain verifies:</strong> 3 events, every hash and link recomputed now" in first
    record_events(1)
    second = viewer_client.get(reverse("audit_log")).content.decode()
    assert "Chain verifies:</strong> 4 events: events after #3 recomputed now, #3 unchanged since" in second
    assert "manage.py verify_audit</code> recomputes everything" in second


def test_forget_starts_over_with_a_full_check(record_events):
    record_events(2)
    verify_for_page(now=1000.0)
    verified_prefix.forget()
    assert verify_for_page(now=1001.0).full
