"""Central's words for the kill protocol are built from gpuadmin/wire/kill_protocol.py, not retyped."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.kills.models import KillStep
from gpuadmin.kills.states import RESULT_STATUS, RESULTS, TRANSITIONS, Status
from gpuadmin.wire import kill_protocol


def test_the_step_choices_are_the_protocols_events() -> None:
    assert KillStep.Event.choices == [(event.value, event.label) for event in kill_protocol.Event]


def test_the_audit_log_has_an_action_for_every_event_with_the_same_label() -> None:
    labels = dict(Action.choices)
    assert {event.value: labels.get(event.value) for event in kill_protocol.Event} == {
        event.value: event.label for event in kill_protocol.Event
    }


def test_every_word_fits_its_column() -> None:
    assert max(map(len, kill_protocol.Event)) <= KillStep._meta.get_field("event").max_length
    assert max(map(len, Action.values)) <= AuditEvent._meta.get_field("action").max_length
    assert max(map(len, kill_protocol.Result)) <= KillStep._meta.get_field("result").max_length
    assert max(map(len, kill_protocol.Method)) <= KillStep._meta.get_field("method").max_length
    assert max(map(len, kill_protocol.SIGNALS)) <= KillStep._meta.get_field("signal").max_length


@pytest.mark.parametrize("result", list(kill_protocol.Result))
def test_every_result_moves_an_approved_or_running_request_to_a_status(result: kill_protocol.Result) -> None:
    status = RESULT_STATUS[result]
    assert status in RESULTS
    assert status in TRANSITIONS[Status.APPROVED] and status in TRANSITIONS[Status.RUNNING]


def test_an_interrupted_order_is_a_failure_and_every_other_result_is_its_namesake() -> None:
    assert RESULT_STATUS[kill_protocol.Result.INTERRUPTED] == Status.FAILED
    interrupted = kill_protocol.Result.INTERRUPTED
    assert all(RESULT_STATUS[r] == r.value for r in kill_protocol.Result if r is not interrupted)


@pytest.mark.django_db
def test_the_migrations_match_the_models() -> None:
    """A new event, finding kind or field needs its migration, in every app: without it this fails."""
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out)
    except SystemExit:
        pytest.fail(f"choices changed without a migration:\n{out.getvalue()}")
