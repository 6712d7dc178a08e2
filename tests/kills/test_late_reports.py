"""Reports that reach central after it expired their request for want of a "started" report.

The agent never starts an order past its deadline, so a report of a run (its "started" lost
to a broker outage, or held up in a backlog) shows the expiry was wrong: the request takes
the status the report shows, and the audit log says so.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.fleet.models import Host
from gpuadmin.kills import services
from gpuadmin.kills.models import FINISH_REPORT_MARGIN, KillRequest, KillStep
from gpuadmin.kills.services.progress import LATE_REPORT_WHY
from gpuadmin.kills.states import Status
from gpuadmin.notify.models import Notification
from gpuadmin.notify.services import plan_for_event
from gpuadmin.wire.kill_protocol import Event, Method, event_record
from gpuadmin.wire.timestamps import wire_time
from tests.factories import GiB
from tests.keys import accept, deliver, host_key, signed_report
from tests.kills.helpers import actions, file, lab_snapshot, refreshed
from tests.notify.helpers import person

pytestmark = pytest.mark.django_db

PID = 4600  # carol's eval.py, 1 GiB on GPU 1
PLAN = [{"signal": "SIGTERM", "grace_seconds": 20}]
PLAN_SECONDS = 20
ALL_GONE = "every target not refused is gone (1 exited)"
# The approval's start deadline (120 s) and the start report margin (30 s) are behind us.
APPROVED_AGO = timedelta(minutes=3)


def _approved_ago(kill_request: KillRequest, ago: timedelta) -> None:
    """Move the request's times back by ``ago``, as if it had been filed, approved and sent then."""
    KillRequest.objects.filter(pk=kill_request.pk).update(
        requested_at=F("requested_at") - ago, pending_expires_at=F("pending_expires_at") - ago,
        decided_at=F("decided_at") - ago, start_deadline=F("start_deadline") - ago,
        dispatched_at=F("dispatched_at") - ago,
    )


@pytest.fixture
def expired_order(lab, requester, approver, sent, approve_committed) -> KillRequest:
    """Approved and sent three minutes ago, expired by the sweeper: no "started" report came."""
    kill_request = file(requester, PID, plan=PLAN)
    approve_committed(kill_request, approver)
    _approved_ago(kill_request, APPROVED_AGO)
    assert services.sweep().expired == 1
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.EXPIRED and kill_request.dispatched_at is not None
    assert "did not report a start" in kill_request.result_detail
    return kill_request


def report(kill_request: KillRequest, seq: int, kind: str, *, host: str = "gpu01",
           **fields: Any) -> KillStep | None:
    """The agent's signed report of step ``seq``, taken (its clock) a few seconds before the deadline."""
    deadline = kill_request.start_deadline or timezone.now()
    at = deadline - timedelta(seconds=5) + timedelta(seconds=seq * 0.1)
    event = event_record(kill_request.order_request_id, seq=seq, at=wire_time(at), event=Event(kind),
                         **fields)
    return services.receive_report(signed_report(event, host))


TARGET = {"pid": PID, "start_time_ticks": PID * 100, "method": Method.PIDFD}


def signal_sent(kill_request: KillRequest, seq: int) -> KillStep | None:
    return report(kill_request, seq, "signal_sent", signal="SIGTERM", detail="sent SIGTERM", **TARGET)


def target_exited(kill_request: KillRequest, seq: int) -> KillStep | None:
    return report(kill_request, seq, "target_exited", signal="SIGTERM", detail="exited", **TARGET)


def finished(kill_request: KillRequest, seq: int, result: str = "succeeded") -> KillStep | None:
    return report(kill_request, seq, "finished", result=result, detail=ALL_GONE)


def correction(kill_request: KillRequest) -> AuditEvent:
    """The one audit event of the request that says its expiry was corrected."""
    (event,) = [e for e in AuditEvent.objects.filter(kill_request_id=kill_request.pk)
                if e.details.get("was") == Status.EXPIRED]
    return event


def test_a_run_reported_after_its_expiry_takes_the_result_it_reports(expired_order):
    started = report(expired_order, 1, "started", detail="executing 1 step on 1 target")
    assert refreshed(expired_order).status == Status.RUNNING
    signal_sent(expired_order, 2)
    target_exited(expired_order, 3)
    done = finished(expired_order, 4)

    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.SUCCEEDED
    assert kill_request.result_detail == ALL_GONE  # not "did not report a start"
    assert started is not None and kill_request.started_at == started.at
    assert done is not None and kill_request.finished_at == done.at
    assert kill_request.targets.get().outcome == "exited"
    assert actions(kill_request) == ["requested", "approved", "dispatched", "expired", "started",
                                     "signal_sent", "target_exited", "finished"]
    fixed = correction(kill_request)
    assert fixed.action == Action.STARTED
    assert fixed.details["status"] == Status.RUNNING and fixed.details["why"] == LATE_REPORT_WHY
    assert AuditEvent.objects.verify().ok


def test_a_signal_step_shows_the_run_when_its_started_report_was_lost(expired_order):
    # The reviewer's case: the agent's deliver() only logged its failed "started" report.
    signal_sent(expired_order, 2)
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.RUNNING
    assert kill_request.finished_at is None and kill_request.result_detail == ""
    assert correction(kill_request).action == Action.SIGNAL_SENT

    target_exited(expired_order, 3)
    finished(expired_order, 4)
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.SUCCEEDED and kill_request.started_at is None
    assert AuditEvent.objects.verify().ok


def test_a_run_seen_from_a_signal_step_owes_its_finished_from_when_that_report_came(expired_order):
    # Not from the approval, long gone: the next sweep would fail a run still in its plan.
    step = signal_sent(expired_order, 2)
    assert step is not None
    assert services.sweep(now=step.received_at + timedelta(seconds=5)).failed == 0
    assert refreshed(expired_order).status == Status.RUNNING
    owed = step.received_at + timedelta(seconds=PLAN_SECONDS) + FINISH_REPORT_MARGIN
    assert services.sweep(now=owed + timedelta(seconds=1)).failed == 1
    assert refreshed(expired_order).status == Status.FAILED


def test_only_a_late_finished_report_sets_the_result(expired_order):
    done = finished(expired_order, 4)  # "started" and the signal steps never came
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.SUCCEEDED
    assert done is not None and kill_request.finished_at == done.at
    assert kill_request.result_detail == ALL_GONE
    fixed = correction(kill_request)
    assert fixed.action == Action.FINISHED and fixed.details["status"] == Status.SUCCEEDED
    # Its "started" may still come (reports overtake each other): it sets the start, not the status.
    started = report(expired_order, 1, "started")
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.SUCCEEDED
    assert started is not None and kill_request.started_at == started.at
    assert AuditEvent.objects.verify().ok


def test_the_agents_own_expiry_stays_an_expiry(expired_order):
    finished(expired_order, 1, result="expired")  # it got the order after its deadline: nothing done
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.EXPIRED
    assert "later the agent reported: expired" in kill_request.result_detail
    assert not [e for e in AuditEvent.objects.all() if e.details.get("was")]


@pytest.fixture
def expired_pending(lab, requester) -> KillRequest:
    """Nobody approved it in time: it never had an order."""
    kill_request = file(requester, PID, plan=PLAN)
    services.sweep(now=kill_request.pending_expires_at + timedelta(seconds=1))
    return kill_request


@pytest.fixture
def expired_unsent(lab, requester, approver, approve_committed, broker_down) -> KillRequest:
    """Approved, but the broker was down until its start deadline: its order never left."""
    broker_down(True)
    kill_request = file(requester, PID, plan=PLAN)
    approve_committed(kill_request, approver)
    _approved_ago(kill_request, APPROVED_AGO)
    services.sweep()
    return kill_request


@pytest.mark.parametrize("expired", ["expired_pending", "expired_unsent"])
def test_a_request_whose_order_never_left_is_not_corrected_by_a_report(expired, request):
    kill_request = refreshed(request.getfixturevalue(expired))
    assert kill_request.status == Status.EXPIRED and kill_request.dispatched_at is None
    why = kill_request.result_detail
    signal_sent(kill_request, 2)
    finished(kill_request, 3)
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.EXPIRED
    assert kill_request.result_detail.startswith(why)  # the report is kept as a note beside it
    assert not [e for e in AuditEvent.objects.all() if e.details.get("was")]


def test_another_hosts_report_naming_it_changes_nothing(expired_order):
    accept("gpu02")
    assert report(expired_order, 1, "started", host="gpu02") is None  # gpu02's key, gpu02's name
    event = {"request_id": expired_order.order_request_id, "seq": 4, "event": "finished",
             "result": "succeeded", "at": datetime.now(UTC).isoformat(), "detail": "forged"}
    forged = signed_report(event, "gpu01", key=host_key("gpu02"))  # gpu01's name, gpu02's key
    assert services.receive_report(forged) is None
    kill_request = refreshed(expired_order)
    assert kill_request.status == Status.EXPIRED
    assert not kill_request.steps.exists()
    assert Host.objects.get(name="gpu01").rejected_message_count == 2


def test_an_expired_request_still_refuses_cancel_and_approve_and_frees_its_process(
    expired_order, requester, approver
):
    with pytest.raises(services.Conflict):
        services.cancel(expired_order.pk, requester, "too late")
    with pytest.raises(services.Conflict):
        services.approve(expired_order.pk, approver)
    assert refreshed(expired_order).status == Status.EXPIRED
    assert file(requester, PID).status == Status.PENDING  # no longer an open request for it


def test_a_corrected_result_has_its_released_memory_confirmed(
    expired_order, django_capture_on_commit_callbacks
):
    target_exited(expired_order, 3)
    finished(expired_order, 4)
    later = lab_snapshot(drop=(PID,))
    taken_at = timezone.now()
    later["taken_at"] = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with django_capture_on_commit_callbacks(execute=True):
        deliver(json.dumps(later), received_at=taken_at + timedelta(seconds=1))
    kill_request = refreshed(expired_order)
    assert kill_request.memory_released_bytes == 1 * GiB
    assert "memory_released" in actions(kill_request)


def test_the_requester_is_told_the_corrected_result(expired_order, requester):
    person("Rick", "rick@lab.example", user=requester)
    finished(expired_order, 4)
    assert plan_for_event(expired_order.pk, Action.EXPIRED) == []  # a stale "expired" notice: dropped
    plan_for_event(expired_order.pk, Action.FINISHED)
    (notice,) = Notification.objects.filter(kill_request=expired_order)
    assert notice.event == Notification.Event.FINISHED and notice.recipient_name == "Rick"
    assert "ended: succeeded" in notice.subject
