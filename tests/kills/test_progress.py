"""Recording the agent's reports: statuses, target outcomes, audit events, idempotency."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from gpuadmin.audit.models import AuditEvent
from gpuadmin.fleet.models import Finding
from gpuadmin.kills import services
from gpuadmin.kills.models import KillStep
from gpuadmin.kills.services import progress
from gpuadmin.kills.states import Status
from gpuadmin.wire.kill_protocol import Event
from tests.keys import signed_report
from tests.kills.helpers import actions, file, refreshed

pytestmark = pytest.mark.django_db

ALL_GONE = "every target not refused is gone"


@pytest.fixture
def running_order(lab, requester, approver, sent, approve_committed):
    """An approved request for the launcher and its workers, and a maker of agent events for it."""
    kill_request = file(requester, 4120, include_descendants=True)
    approve_committed(kill_request, approver)
    kill_request = refreshed(kill_request)
    start = datetime.now(UTC)

    def event(seq: int, kind: str, pid: int | None = None, **fields: Any) -> dict[str, Any]:
        return {
            "request_id": kill_request.order_request_id, "seq": seq,
            "at": (start + timedelta(seconds=seq)).isoformat().replace("+00:00", "Z"),
            "event": kind, "pid": pid, "start_time_ticks": pid * 100 if pid else None,
            "signal": None, "method": "pidfd" if pid else None, "detail": "", **fields,
        }

    return kill_request, event


def test_a_run_moves_the_request_and_its_targets_along(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "started", detail="executing SIGINT → 10 s → ..."))
    assert refreshed(kill_request).status == Status.RUNNING
    for seq, pid in enumerate((4120, 4121, 4123), start=2):
        services.record_progress(event(seq, "signal_sent", pid, signal="SIGINT", detail="sent SIGINT"))
    assert {t.outcome for t in kill_request.targets.all()} == {"signalled"}
    services.record_progress(event(5, "target_exited", 4120, signal="SIGINT", detail="exited (after SIGINT)"))
    services.record_progress(event(6, "target_exited", 4121, signal="SIGINT",
                                   detail="exited, not yet reaped by parent 4120 (python)", parent_pid=4120))
    services.record_progress(event(7, "target_exited", 4123, signal="SIGINT", detail="exited"))
    services.record_progress(event(8, "finished", result="succeeded", detail=ALL_GONE))
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.SUCCEEDED
    assert kill_request.result_detail == ALL_GONE
    assert kill_request.started_at is not None and kill_request.finished_at > kill_request.started_at
    outcomes = {t.pid: (t.outcome, t.last_signal) for t in kill_request.targets.all()}
    assert outcomes == {4120: ("exited", "SIGINT"), 4121: ("exited_not_reaped", "SIGINT"),
                        4123: ("exited", "SIGINT")}
    assert actions(kill_request) == [
        "requested", "approved", "dispatched", "started",
        "signal_sent", "signal_sent", "signal_sent",
        "target_exited", "target_exited", "target_exited", "finished",
    ]
    signal_event = AuditEvent.objects.filter(action="signal_sent").first()
    assert signal_event.details["signal"] == "SIGINT" and signal_event.details["pid"] == 4120
    assert signal_event.details["method"] == "pidfd"


def test_a_repeated_report_is_stored_once(running_order):
    kill_request, event = running_order
    first = services.record_progress(event(1, "started"))
    again = services.record_progress(event(1, "started"))
    assert first is not None and again is None
    assert KillStep.objects.filter(request=kill_request).count() == 1
    assert actions(kill_request).count("started") == 1


def test_a_finished_report_that_overtakes_started_still_lands(running_order):
    kill_request, event = running_order
    services.record_progress(event(3, "finished", result="succeeded", detail="done"))
    services.record_progress(event(1, "started"))
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.SUCCEEDED
    assert kill_request.started_at is not None
    assert list(kill_request.steps.values_list("seq", flat=True)) == [1, 3]


def test_a_survivor_is_unkillable_and_opens_a_finding(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "started"))
    services.record_progress(event(2, "signal_sent", 4120, signal="SIGKILL"))
    services.record_progress(event(3, "target_survived", 4120, signal="SIGKILL", state="D",
                                   detail="still alive 30 s after SIGKILL; uninterruptible sleep (D)"))
    services.record_progress(event(4, "finished", result="unkillable", detail="1 of 3 targets still alive"))
    assert refreshed(kill_request).status == Status.UNKILLABLE
    assert kill_request.targets.get(pid=4120).outcome == "survived"
    finding = Finding.objects.get(kind=Finding.Kind.UNKILLABLE)
    assert finding.key == "4120:412000" and finding.is_open
    assert finding.details["kill_request_id"] == kill_request.pk
    assert "target_survived" in actions(kill_request)


def test_a_refusal_on_the_host_is_recorded_with_why(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "started"))
    services.record_progress(event(2, "refused", 4121, reason="identity_changed",
                                   detail="refused: start time changed: PID reused"))
    services.record_progress(event(3, "finished", result="refused", detail="all targets refused"))
    assert refreshed(kill_request).status == Status.REFUSED
    target = kill_request.targets.get(pid=4121)
    assert target.outcome == "refused" and "PID reused" in target.outcome_detail
    refused = AuditEvent.objects.get(action="refused")
    assert refused.details["reason"] == "identity_changed"


def test_an_order_received_too_late_is_expired(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "finished", result="expired", detail="received after its deadline"))
    assert refreshed(kill_request).status == Status.EXPIRED


def test_an_interrupted_run_is_failed_and_says_so(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "started"))
    services.record_progress(event(2, "finished", result="interrupted", duplicate=True,
                                   detail="an earlier delivery claimed this order and never finished"))
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.FAILED
    assert kill_request.result_detail.startswith("interrupted on the host")


@pytest.mark.parametrize(
    "bad",
    [
        "not an object",
        {"request_id": "x", "seq": 1, "event": "started", "at": "2026-01-01T00:00:00Z"},
        {"request_id": "1", "seq": -1, "event": "started", "at": "2026-01-01T00:00:00Z"},
        {"request_id": "1", "seq": 1, "event": "rm -rf", "at": "2026-01-01T00:00:00Z"},
        {"request_id": "1", "seq": 1, "event": "started", "at": "yesterday"},
        {"request_id": "999999", "seq": 1, "event": "started", "at": "2026-01-01T00:00:00Z"},
    ],
)
def test_an_unusable_report_is_dropped_and_changes_nothing(running_order, bad, caplog):
    kill_request, _ = running_order
    assert services.record_progress(bad) is None
    assert refreshed(kill_request).status == Status.APPROVED
    assert not KillStep.objects.exists()
    assert "dropped a kill progress report" in caplog.text


def test_a_late_finished_after_the_sweeper_gave_up_is_kept_beside_the_result(running_order):
    kill_request, event = running_order
    services.record_progress(event(1, "started"))
    services.sweep(now=timezone.now() + timedelta(seconds=60 + 60 + 5))
    assert refreshed(kill_request).status == Status.FAILED
    services.record_progress(event(2, "finished", result="succeeded", detail=ALL_GONE))
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.FAILED
    assert "later the agent reported: succeeded" in kill_request.result_detail
    assert actions(kill_request).count("finished") == 2


def test_a_report_for_an_earlier_request_with_the_same_number_is_dropped(running_order, caplog):
    """Central's database was recreated: request #1 of the old one is not this #1."""
    kill_request, event = running_order
    stale = event(1, "finished", result="succeeded")
    stale["request_id"] = f"{kill_request.pk}-0123456789ab"
    assert services.record_progress(stale) is None
    assert refreshed(kill_request).status == Status.APPROVED
    assert "is not this request's" in caplog.text


def test_a_report_that_overtook_an_earlier_one_waits_for_it(running_order):
    kill_request, event = running_order
    with pytest.raises(services.EarlierStepsMissing):
        services.record_progress(event(2, "signal_sent", 4120, signal="SIGINT"), wait_for_earlier=True)
    assert not KillStep.objects.filter(request=kill_request).exists()
    services.record_progress(event(1, "started"), wait_for_earlier=True)
    services.record_progress(event(2, "signal_sent", 4120, signal="SIGINT"), wait_for_earlier=True)
    stored = KillStep.objects.filter(request=kill_request).order_by("id")
    assert list(stored.values_list("seq", flat=True)) == [1, 2]


def test_the_audit_log_follows_the_agent_order_when_reports_arrive_swapped(running_order, monkeypatch):
    from gpuadmin.kills.tasks import record_kill_progress

    kill_request, event = running_order
    started, sent = event(1, "started"), event(2, "signal_sent", 4120, signal="SIGINT")
    # The task run for step 2 retries (eagerly, here) while step 1 is missing;
    # step 1 arriving in between is what a second central worker does.
    calls = []
    original = progress.record_progress

    def record_with_step_one_arriving(ev, **kwargs):
        calls.append(ev["seq"])
        if len(calls) == 2:
            original(started)
        return original(ev, **kwargs)

    monkeypatch.setattr(progress, "record_progress", record_with_step_one_arriving)
    record_kill_progress.apply(args=[signed_report(sent, "gpu01")])
    assert calls == [2, 2]
    assert actions(kill_request)[-2:] == ["started", "signal_sent"]


def test_a_report_whose_predecessor_never_comes_is_still_recorded(running_order):
    from gpuadmin.kills.tasks import record_kill_progress

    kill_request, event = running_order
    record_kill_progress.apply(args=[signed_report(event(3, "signal_sent", 4121, signal="SIGINT"), "gpu01")])
    assert list(KillStep.objects.filter(request=kill_request).values_list("seq", flat=True)) == [3]


@pytest.mark.parametrize("kind", list(Event))
def test_every_event_of_the_protocol_is_stored_and_logged(running_order, kind):
    kill_request, event = running_order
    pid = None if kind in (Event.STARTED, Event.FINISHED) else 4120
    services.record_progress(event(1, kind, pid, result="succeeded", detail=f"a {kind} event"))
    assert list(kill_request.steps.values_list("event", "detail")) == [(kind, f"a {kind} event")]
    assert actions(kill_request)[-1] == kind
