"""The sweeper: expiry of pending and approved requests, and agents that went silent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from tests.kills.helpers import actions, file, refreshed

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("lab")
def test_a_pending_request_expires_after_the_configured_time(requester, settings):
    settings.GPUADMIN_PENDING_EXPIRY_SECONDS = 600
    kill_request = file(requester, 4600)
    assert services.sweep(now=timezone.now() + timedelta(seconds=590)).expired == 0
    assert refreshed(kill_request).status == Status.PENDING
    assert services.sweep(now=timezone.now() + timedelta(seconds=601)).expired == 1
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.EXPIRED
    assert kill_request.result_detail == "not approved before it expired"
    assert actions(kill_request) == ["requested", "expired"]
    assert AuditEvent.objects.get(action="expired").actor_name == ""


@pytest.mark.usefixtures("lab")
def test_an_approved_request_never_started_expires(requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    deadline = refreshed(kill_request).start_deadline
    # A start report may still be on its way for a while after the deadline.
    assert services.sweep(now=deadline + timedelta(seconds=5)).expired == 0
    assert services.sweep(now=deadline + timedelta(seconds=31)).expired == 1
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.EXPIRED
    assert "did not report a start" in kill_request.result_detail


@pytest.mark.usefixtures("lab")
def test_a_running_request_whose_agent_went_silent_is_failed(requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600, plan=[{"signal": "SIGTERM", "grace_seconds": 20}])
    approve_committed(kill_request, approver)
    order_id = refreshed(kill_request).order_request_id
    services.record_progress({"request_id": order_id, "seq": 1, "event": "started",
                              "at": timezone.now().isoformat()})
    assert services.sweep(now=timezone.now() + timedelta(seconds=75)).failed == 0
    assert services.sweep(now=timezone.now() + timedelta(seconds=81)).failed == 1
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.FAILED
    assert "no \"finished\" report" in kill_request.result_detail
    assert "#1 (started)" in kill_request.result_detail


@pytest.mark.usefixtures("lab")
def test_final_requests_are_left_alone(requester, approver):
    kill_request = file(requester, 4600)
    services.reject(kill_request.pk, approver, "no")
    services.sweep(now=timezone.now() + timedelta(days=2))
    assert refreshed(kill_request).status == Status.REJECTED
