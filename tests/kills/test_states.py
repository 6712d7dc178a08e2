"""The transition table is the only way a request's status changes."""

from __future__ import annotations

import pytest

from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import FINAL, TRANSITIONS, InvalidTransition, Status


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
