"""What a decision writes down: who decided, when, why, in the request and in the audit log;
and what a refused decision tells the caller (the field to fix, the state it is in)."""

from __future__ import annotations

import pytest

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from tests.kills.helpers import file, refreshed

pytestmark = pytest.mark.django_db


def audited(action: str) -> AuditEvent:
    return AuditEvent.objects.get(action=action)


def test_an_approval_names_the_approver_in_the_request_and_the_log(lab, requester, approver, sent):
    kill_request = refreshed(services.approve(file(requester, 4600).pk, approver))
    assert kill_request.approved_by == approver
    event = audited("approved")
    assert (event.actor, event.actor_name) == (approver, "april")
    assert event.details["start_deadline"] == kill_request.start_deadline.isoformat()


def test_a_rejection_records_who_when_and_the_reason_stripped(lab, requester, approver):
    kill_request = refreshed(services.reject(file(requester, 4600).pk, approver, "  ask carol first \n"))
    assert (kill_request.closed_by, kill_request.closed_by_name) == (approver, "april")
    assert kill_request.decided_at is not None
    assert kill_request.decision_reason == "ask carol first"
    event = audited("rejected")
    assert event.actor == approver
    assert event.details == {"reason": "ask carol first"}


def test_a_rejection_without_a_reason_points_at_the_reason_field(lab, requester, approver):
    with pytest.raises(services.BadInput) as refused:
        services.reject(file(requester, 4600).pk, approver, "")
    assert refused.value.extra == {"field": "reason"}
    assert str(refused.value) == "a rejection needs a reason, for the requester and the audit log"


def test_an_approver_may_cancel_a_request_someone_else_filed(lab, requester, approver):
    kill_request = refreshed(services.cancel(file(requester, 4600).pk, approver, " duplicate "))
    assert kill_request.status == Status.CANCELLED
    assert (kill_request.closed_by, kill_request.closed_by_name) == (approver, "april")
    assert kill_request.decided_at is not None
    assert kill_request.decision_reason == "duplicate"
    event = audited("cancelled")
    assert event.actor == approver
    assert event.details == {"reason": "duplicate", "was": "pending"}


def test_a_cancellation_without_a_reason_records_none(lab, requester):
    kill_request = refreshed(services.cancel(file(requester, 4600).pk, requester))
    assert kill_request.decision_reason == ""
    assert audited("cancelled").details == {"reason": "", "was": "pending"}


def test_someone_who_may_not_cancel_is_told_who_may(lab, requester, sent):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    with pytest.raises(services.NotAllowed) as refused:
        services.cancel(file(requester, 4600).pk, make_person("otto", Role.REQUESTER))
    assert str(refused.value) == "Only the requester or an approver can cancel a kill request."


def test_a_sigkill_only_plan_points_at_the_field_that_allows_it(lab, requester, approver, sent):
    kill_request = file(requester, 4600, plan=[{"signal": "SIGKILL", "grace_seconds": 10}])
    with pytest.raises(services.BadInput) as refused:
        services.approve(kill_request.pk, approver)
    assert refused.value.extra == {"field": "allow_sigkill_only"}
    assert str(refused.value) == (
        "this plan starts with SIGKILL (no chance to save a checkpoint); approve it only by "
        'explicitly allowing "SIGKILL only", or reject it'
    )


def test_a_decision_on_a_closed_request_says_its_state(lab, requester, approver):
    kill_request = file(requester, 4600)
    services.reject(kill_request.pk, approver, "no")
    with pytest.raises(services.Conflict) as refused:
        services.reject(kill_request.pk, approver, "again")
    assert refused.value.extra == {"status": Status.REJECTED}
    assert str(refused.value) == f"request #{kill_request.pk} is rejected, not pending"
    with pytest.raises(services.Conflict) as refused:
        services.cancel(kill_request.pk, requester)
    assert refused.value.extra == {"status": Status.REJECTED}
    assert str(refused.value) == (
        f"request #{kill_request.pk} is rejected; "
        "only pending or approved (not yet sent) requests can be cancelled"
    )


def test_a_second_approval_says_who_approved_and_the_state_now(lab, requester, approver, sent):
    kill_request = file(requester, 4600)
    services.approve(kill_request.pk, approver)
    with pytest.raises(services.Conflict) as refused:
        services.approve(kill_request.pk, approver)
    assert refused.value.extra == {"status": Status.APPROVED}
    assert str(refused.value).startswith(f"request #{kill_request.pk} is already approved (by april at ")
    assert str(refused.value).endswith(" UTC); it is approved")


def test_approving_an_expired_request_says_it_expired(lab, requester, approver, sent):
    from datetime import timedelta

    from django.utils import timezone

    kill_request = file(requester, 4600)
    with pytest.raises(services.Conflict) as refused:
        services.approve(kill_request.pk, approver, now=timezone.now() + timedelta(seconds=3601))
    assert refused.value.extra == {"status": Status.EXPIRED}


def test_a_sent_order_cannot_be_cancelled_and_the_refusal_says_it_is_approved(
    lab, requester, approver, sent, approve_committed
):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    with pytest.raises(services.Conflict) as refused:
        services.cancel(kill_request.pk, approver)
    assert refused.value.extra == {"status": Status.APPROVED}


def test_who_sees_which_decision_buttons(lab, requester, approver, sent, approve_committed):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    stranger = make_person("otto", Role.REQUESTER)
    pending = file(requester, 4600)
    assert [services.may_decide(pending, person) for person in (requester, approver, stranger)] == [
        False, True, False
    ]
    assert [services.may_cancel(pending, person) for person in (requester, approver, stranger)] == [
        True, True, False
    ]
    approve_committed(pending, approver)
    sent_order = refreshed(pending)
    assert not services.may_decide(sent_order, approver)
    assert not services.may_cancel(sent_order, approver) and not services.may_cancel(sent_order, requester)


def test_refused_deciders_are_told_what_they_may_not_do(lab, requester, settings):
    from gpuadmin.accounts.roles import Role
    from tests.people import make_person

    kill_request = file(requester, 4600)
    with pytest.raises(services.NotAllowed) as refused:
        services.reject(kill_request.pk, requester, "mine")
    assert str(refused.value) == "Only an approver can reject a kill request."
    both = make_person("bo", Role.REQUESTER, Role.APPROVER)
    own = file(both, 4120)
    with pytest.raises(services.NotAllowed) as refused:
        services.reject(own.pk, both, "mine")
    assert str(refused.value) == (
        f"You filed request #{own.pk}; a different approver must reject it "
        "(a one-admin lab may set GPUADMIN_ALLOW_SELF_APPROVAL=1). You can cancel it instead."
    )


def test_an_unknown_request_is_not_found_by_number(db, approver):
    with pytest.raises(services.NotFound) as missing:
        services.approve(987654, approver)
    assert str(missing.value) == "no kill request #987654"


def test_a_running_request_cannot_be_cancelled_and_is_not_called_unsent(
    lab, requester, approver, sent, approve_committed
):
    from gpuadmin.kills.models import KillRequest

    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    KillRequest.objects.filter(pk=kill_request.pk).update(status=Status.RUNNING)
    with pytest.raises(services.Conflict) as refused:
        services.cancel(kill_request.pk, approver)
    assert str(refused.value) == (
        f"request #{kill_request.pk} is running; "
        "only pending or approved (not yet sent) requests can be cancelled"
    )
