"""The transition table is the only way a request's status changes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import (
    ACTIVE,
    FINAL,
    LATE_REPORT_CORRECTIONS,
    OPEN,
    RESULT_STATUS,
    TRANSITIONS,
    InvalidTransition,
    Status,
)
from gpuadmin.wire.kill_protocol import Result


def request_in(status: Status) -> KillRequest:
    return KillRequest(status=status)


@pytest.mark.parametrize("final", sorted(FINAL))
def test_final_states_go_nowhere(final):
    for wanted in Status:
        with pytest.raises(InvalidTransition, match="final"):
            request_in(final).transition(wanted)


def test_rejected_cancelled_and_expired_are_final():
    assert {Status.REJECTED, Status.CANCELLED, Status.EXPIRED} <= FINAL


@pytest.mark.parametrize(
    ("current", "wanted"),
    [
        (Status.PENDING, Status.RUNNING),
        (Status.PENDING, Status.SUCCEEDED),
        (Status.APPROVED, Status.REJECTED),
        (Status.APPROVED, Status.PENDING),
        (Status.RUNNING, Status.CANCELLED),
        (Status.RUNNING, Status.APPROVED),
    ],
)
def test_transitions_outside_the_table_are_refused(current, wanted):
    kill_request = request_in(current)
    with pytest.raises(InvalidTransition):
        kill_request.transition(wanted)
    assert kill_request.status == current


def test_every_allowed_transition_changes_the_status():
    for current, allowed in TRANSITIONS.items():
        for wanted in allowed:
            kill_request = request_in(current)
            kill_request.transition(wanted)
            assert kill_request.status == wanted


def test_the_table_covers_every_status():
    assert set(TRANSITIONS) == set(Status)


def test_a_refused_transition_says_both_states_in_words():
    with pytest.raises(InvalidTransition) as refused:
        request_in(Status.PENDING).transition(Status.RUNNING)
    assert str(refused.value) == "a request that is pending approval cannot become running"
    assert (refused.value.current, refused.value.wanted) == (Status.PENDING, Status.RUNNING)


def test_a_transition_out_of_a_final_state_says_it_is_final():
    with pytest.raises(InvalidTransition) as refused:
        request_in(Status.REJECTED).transition(Status.APPROVED)
    assert str(refused.value) == "the request is already rejected; that is final"


def test_a_late_report_corrects_only_an_expiry_and_expired_stays_final():
    corrected_to = {Status.RUNNING, Status.SUCCEEDED, Status.FAILED, Status.UNKILLABLE, Status.REFUSED}
    assert {Status.EXPIRED: corrected_to} == LATE_REPORT_CORRECTIONS
    assert TRANSITIONS[Status.EXPIRED] == frozenset()
    assert Status.EXPIRED in FINAL and Status.EXPIRED not in OPEN | ACTIVE
    assert {Status.PENDING, Status.APPROVED, Status.RUNNING} == OPEN
    assert {Status.APPROVED, Status.RUNNING} == ACTIVE


def test_only_an_agents_report_of_a_sent_order_leaves_expired():
    sent = KillRequest(status=Status.EXPIRED, dispatched_at=datetime.now(UTC))
    with pytest.raises(InvalidTransition, match="final"):
        sent.transition(Status.RUNNING)
    with pytest.raises(InvalidTransition, match="final"):
        sent.transition(Status.CANCELLED, by_report=True)
    with pytest.raises(InvalidTransition, match="final"):
        KillRequest(status=Status.EXPIRED).transition(Status.RUNNING, by_report=True)  # never sent
    with pytest.raises(InvalidTransition, match="final"):
        KillRequest(status=Status.FAILED, dispatched_at=datetime.now(UTC)).transition(
            Status.SUCCEEDED, by_report=True)
    sent.transition(Status.RUNNING, by_report=True)
    assert sent.status == Status.RUNNING


def test_each_agent_result_is_the_status_of_its_name_but_interrupted_which_failed() -> None:
    assert RESULT_STATUS[Result.INTERRUPTED] is Status.FAILED
    for result in Result:
        if result is not Result.INTERRUPTED:
            assert RESULT_STATUS[result] is Status(result.value)
