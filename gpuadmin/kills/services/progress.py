"""Recording what the agent reports, step by step.

Reports arrive as separate messages on the central queue, possibly twice (a
redelivered order answers from the agent's journal) and possibly out of order
(several central workers). So: one KillStep per (request, seq), stored under
the request's row lock; a repeat changes nothing and writes no audit event;
status only moves forward along the transition table.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from django.db import transaction

from gpuadmin.audit.models import Action
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.findings import open_unkillable
from gpuadmin.kills.states import RESULT_STATUS, Status, can_transition
from gpuadmin.probe.kill.protocol import BadEvent, Event, Method, ParsedEvent, Result, parse_event

logger = logging.getLogger(__name__)

Outcome = KillTarget.Outcome

DETAIL_MAX_CHARS = 4000


class BadReport(BadEvent):
    """A progress event central cannot use; it is logged and dropped."""


class EarlierStepsMissing(Exception):
    """A report overtook an earlier one of the same order (several central
    workers take reports from one queue). The task retries it shortly, so the
    audit log reads in the order things happened on the host."""


def _request_id(value: Any) -> tuple[int, str | None]:
    """(primary key, order key) from an order's request id: "42-3f9a0c1b2d4e", or 42 / "42" alone."""
    try:
        return KillRequest.parse_order_request_id(value)
    except ValueError as error:
        raise BadReport(str(error)) from None


def _check(event: Any) -> tuple[ParsedEvent, int, str | None]:
    """The event as the protocol reads it, and the request it names (primary key, order key)."""
    parsed = parse_event(event)
    request_id, order_key = _request_id(parsed.request_id)
    return parsed, request_id, order_key


def _text(value: Any, limit: int = DETAIL_MAX_CHARS) -> str:
    return "" if value is None else str(value)[:limit]


def _target_for(kill_request: KillRequest, event: dict[str, Any]) -> KillTarget | None:
    pid, start = event.get("pid"), event.get("start_time_ticks")
    if pid is None:
        return None
    found = kill_request.targets.filter(pid=pid)
    if start is not None:
        found = found.filter(start_time_ticks=start)
    return found.first()


def record_progress(event: Any, *, wait_for_earlier: bool = False) -> KillStep | None:
    """Store one agent event; returns the new step, or None for a repeat or an unusable report.

    With ``wait_for_earlier``, raise EarlierStepsMissing instead of storing an
    event whose predecessors (seq 1 .. seq-1, numbered without gaps by the
    agent) are not all stored yet. The caller decides how long to wait: a
    report is never lost, at worst recorded out of order.
    """
    try:
        parsed, request_id, order_key = _check(event)
    except BadEvent as exc:
        logger.warning("dropped a kill progress report: %s (%r)", exc, event)
        return None
    with transaction.atomic():
        try:
            kill_request = KillRequest.objects.locked(request_id)
        except KillRequest.DoesNotExist:
            logger.warning("dropped a kill progress report for unknown request #%s", request_id)
            return None
        if order_key is not None and order_key != kill_request.order_key:
            # An order of another request that had this number (central's database was recreated).
            logger.warning("dropped a kill progress report for request #%s: its key %r is not this request's",
                           request_id, order_key)
            return None
        seq = parsed.seq
        if KillStep.objects.filter(request=kill_request, seq=seq).exists():
            return None
        if wait_for_earlier and KillStep.objects.filter(request=kill_request, seq__lt=seq).count() < seq - 1:
            raise EarlierStepsMissing(f"request #{request_id}: step {seq} arrived before an earlier one")
        target = _target_for(kill_request, event)
        step = KillStep.objects.create(
            request=kill_request,
            target=target,
            seq=seq,
            at=parsed.at,
            event=parsed.event,
            pid=event.get("pid") if isinstance(event.get("pid"), int) else None,
            signal=_text(event.get("signal"), 8),
            method=_text(event.get("method"), 8),
            result=_text(event.get("result"), 16),
            detail=_text(event.get("detail")),
            raw=event,
        )
        _APPLY.get(parsed.event, _logged)(kill_request, target, step, event)
    return step


def _target_details(target: KillTarget | None, step: KillStep, event: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {"seq": step.seq, "at": step.at.isoformat(), "detail": step.detail}
    if target is not None:
        details.update(pid=target.pid, start_time_ticks=target.start_time_ticks, name=target.name,
                       user=target.user)
    elif step.pid is not None:
        details["pid"] = step.pid
    for key in ("signal", "method", "reason", "parent_pid", "state", "result", "duplicate"):
        if event.get(key) is not None:
            details[key] = event[key]
    return details


def _set_outcome(target: KillTarget, outcome: Outcome, step: KillStep) -> None:
    target.outcome = outcome
    target.outcome_detail = step.detail
    target.save(update_fields=["outcome", "outcome_detail"])


def _started(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
             event: dict[str, Any]) -> None:
    if kill_request.status == Status.APPROVED:
        kill_request.transition(Status.RUNNING)
        kill_request.started_at = step.at
        kill_request.save(update_fields=["status", "started_at"])
    elif kill_request.started_at is None:
        kill_request.started_at = step.at
        kill_request.save(update_fields=["started_at"])
    audit(Action.STARTED, kill_request, details=_target_details(None, step, event))


def _signal_sent(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
                 event: dict[str, Any]) -> None:
    if target is not None:
        target.last_signal = step.signal
        if not target.is_gone:
            target.outcome = Outcome.SIGNALLED
            target.outcome_detail = step.detail
        target.save(update_fields=["last_signal", "outcome", "outcome_detail"])
    details = _target_details(target, step, event)
    if step.method == Method.KILL:
        details["note"] = "pidfds unavailable: sent with kill() right after re-verification"
    audit(Action.SIGNAL_SENT, kill_request, details=details)


def _target_exited(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
                   event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.EXITED_NOT_REAPED if event.get("parent_pid") else Outcome.EXITED, step)
    audit(Action.TARGET_EXITED, kill_request, details=_target_details(target, step, event))


def _target_survived(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
                     event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.SURVIVED, step)
        open_unkillable(kill_request, target, step)
    audit(Action.TARGET_SURVIVED, kill_request, details=_target_details(target, step, event))


def _refused(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
             event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.REFUSED, step)
    audit(Action.REFUSED, kill_request, details=_target_details(target, step, event))


def _finished(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
              event: dict[str, Any]) -> None:
    result = event.get("result")
    # A str finds its StrEnum key (same hash, equal); an unknown word finds None.
    status = RESULT_STATUS.get(cast(Result, result)) if isinstance(result, str) else None
    detail = step.detail
    if result == Result.INTERRUPTED:
        detail = f"interrupted on the host: {detail}"
    if status is None:
        detail = f"the agent reported an unknown result {result!r}: {detail}"
        status = Status.FAILED
    if can_transition(kill_request.status, status):
        kill_request.transition(status)
        kill_request.finished_at = step.at
        kill_request.result_detail = detail
        kill_request.save(update_fields=["status", "finished_at", "result_detail"])
    elif kill_request.is_final:
        # Already closed here (the sweeper gave up waiting, or a repeat answer);
        # the report is kept in the timeline and the log, and said next to the result.
        note = f"later the agent reported: {result} — {step.detail}"
        if note not in kill_request.result_detail:
            kill_request.result_detail = f"{kill_request.result_detail}\n{note}".strip()[:DETAIL_MAX_CHARS]
            kill_request.save(update_fields=["result_detail"])
    details = _target_details(None, step, event)
    details["targets"] = event.get("targets", [])
    audit(Action.FINISHED, kill_request, details=details)


def _logged(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
            event: dict[str, Any]) -> None:
    """An event that changes nothing here (a newer agent's, say): stored in the timeline and logged."""
    audit(Action(step.event), kill_request, details=_target_details(target, step, event))


# What each event does to the request; an event not listed is only stored and logged.
_APPLY = {
    Event.STARTED: _started,
    Event.SIGNAL_SENT: _signal_sent,
    Event.TARGET_EXITED: _target_exited,
    Event.TARGET_SURVIVED: _target_survived,
    Event.REFUSED: _refused,
    Event.FINISHED: _finished,
}
