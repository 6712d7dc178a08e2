"""The rules that read a request's times live on the model, next to the query that applies them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.kills import services
from gpuadmin.kills.models import START_REPORT_MARGIN, KillRequest
from gpuadmin.kills.states import Status
from tests.kills.helpers import file, refreshed

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("lab")
def test_the_late_query_selects_exactly_the_requests_is_late_names(
    requester, approver, sent, approve_committed
):
    pending = file(requester, 4600)
    approved = file(requester, 4120)
    approve_committed(approved, approver)
    approved = refreshed(approved)
    sent_late = approved.start_deadline + START_REPORT_MARGIN
    moments = [
        timezone.now(),
        pending.pending_expires_at - timedelta(microseconds=1),
        pending.pending_expires_at,
        approved.start_deadline,
        sent_late - timedelta(microseconds=1),
        sent_late,
    ]
    seen = []
    for now in moments:
        by_query = set(KillRequest.objects.late(now).values_list("pk", flat=True))
        by_rule = {k.pk for k in KillRequest.objects.all() if k.is_late(now)}
        assert by_query == by_rule, now
        seen.append(by_query)
    # Both sides of each request's boundary were looked at.
    assert seen[0] == set()
    assert pending.pk not in seen[1] and pending.pk in seen[2]
    assert approved.pk not in seen[4] and approved.pk in seen[5]


@pytest.mark.usefixtures("lab")
def test_a_request_is_cancellable_until_its_order_left(requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600)
    assert kill_request.is_cancellable
    assert services.may_cancel(kill_request, requester) and services.may_cancel(kill_request, approver)
    approve_committed(kill_request, approver)
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.APPROVED and kill_request.dispatched_at is not None
    assert not kill_request.is_cancellable
    assert not services.may_cancel(kill_request, approver)
    with pytest.raises(services.Conflict, match="already sent"):
        services.cancel(kill_request.pk, approver)


@pytest.mark.usefixtures("lab")
def test_who_may_decide_or_cancel_depends_on_the_status_too(requester, approver, viewer):
    kill_request = file(requester, 4600)
    assert services.may_decide(kill_request, approver) and not services.may_decide(kill_request, requester)
    assert not services.may_cancel(kill_request, viewer)
    services.reject(kill_request.pk, approver, "not that one")
    kill_request = refreshed(kill_request)
    assert not services.may_decide(kill_request, approver)
    assert not services.may_cancel(kill_request, approver)
    assert not services.may_cancel(kill_request, requester)
    with pytest.raises(services.Conflict, match="only pending or approved"):
        services.cancel(kill_request.pk, requester)
    with pytest.raises(services.NotAllowed):
        services.cancel(kill_request.pk, viewer)


@pytest.mark.usefixtures("lab")
def test_the_agent_owes_its_finished_report_a_plan_and_a_margin_after_it_began(
    requester, approver, sent, approve_committed
):
    kill_request = file(requester, 4600, plan=[{"signal": "SIGTERM", "grace_seconds": 20}])
    assert kill_request.finish_deadline is None
    approve_committed(kill_request, approver)
    kill_request = refreshed(kill_request)
    assert kill_request.finish_deadline == kill_request.decided_at + timedelta(seconds=20 + 60)
