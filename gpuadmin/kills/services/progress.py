"""Recording what the agent reports, step by step.

``receive_report`` takes a report as it came off the broker: it counts only
when signed by the accepted key of the host the request is for, and names the
request by its full order id ("42-3f9a0c1b2d4e"); anything else is a rejected
message (``fleet.intake.trust``) and changes nothing. A signed "order_refused" report
(the agent did not accept something as an order) is written to the audit log
and changes no request.

Reports arrive as separate messages on the central queue, possibly twice (a
redelivered order answers from the agent's journal) and possibly out of order
(several central workers). So: one KillStep per (request, seq), stored under
the request's row lock; a repeat changes nothing and writes no audit event,
and a report for a stored (request, seq) with other content is recorded as a
conflict; status only moves forward along the transition table.

One report may also correct a status: central expires an approved request whose
"started" report has not come by the start deadline plus a margin, but that
report may have been lost (the agent only logs a failed send) or held up. A
later report of the run shows the agent did start in time, and the request
takes the status the report shows, as it would have from approved; the step's
audit event says what the status was and why it changed
(``states.LATE_REPORT_CORRECTIONS``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, cast

from django.db import transaction
from django.utils import timezone

from gpuadmin.audit import log
from gpuadmin.audit.models import Action
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Host, SnapshotRejection
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.findings import open_unkillable
from gpuadmin.kills.states import RESULT_STATUS, Status, can_transition
from gpuadmin.text import clip
from gpuadmin.wire.kill_protocol import BadEvent, Event, Method, ParsedEvent, Result, parse_event
from gpuadmin.wire.signing import BadMessage, MessageKind, Opened, open_envelope

logger = logging.getLogger(__name__)

Outcome = KillTarget.Outcome

DETAIL_MAX_CHARS = 4000
# A report is one event: a few KiB, a "finished" one a summary per target.
REPORT_MAX_CHARS = 4 * 1024 * 1024
# Keys a repeat answer from the agent's journal adds or rewrites: not a conflict.
_REPEAT_ANSWER_KEYS = frozenset({"duplicate", "answered_at", "detail", "host"})
# Why a report of a run corrects an expiry: the agent never starts an order past its deadline.
LATE_REPORT_WHY = ("the agent's report arrived after the start report margin; "
                   "the agent started before its deadline")


class BadReport(BadEvent):
    """A progress event central cannot use; it is logged and dropped."""


class EarlierStepsMissing(Exception):
    """A report overtook an earlier one of the same order (several central
    workers take reports from one queue). The task retries it shortly, so the
    audit log reads in the order things happened on the host."""


def _request_id(value: Any) -> tuple[int, str]:
    """(primary key, order key) from an order's request id "42-3f9a0c1b2d4e"; a bare number is refused."""
    try:
        return KillRequest.parse_order_request_id(value)
    except ValueError as error:
        raise BadReport(str(error)) from None


def _check(event: Any) -> tuple[ParsedEvent, int, str]:
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


def record_progress(event: Any, *, wait_for_earlier: bool = False,
                    signed: dict[str, str] | None = None) -> KillStep | None:
    """Store one agent event; returns the new step, or None for a repeat or an unusable report.

    ``signed``: the report as its host signed it (``_signed_columns``), kept on the step.

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
        if order_key != kill_request.order_key:
            # An order of another request that had this number (central's database was recreated).
            logger.warning("dropped a kill progress report for request #%s: its key %r is not this request's",
                           request_id, order_key)
            return None
        seq = parsed.seq
        stored = KillStep.objects.filter(request=kill_request, seq=seq).first()
        if stored is not None:
            if not _same_report(stored.raw, event):
                _record_conflict(kill_request, stored, event)
            return None
        if wait_for_earlier and KillStep.objects.filter(request=kill_request, seq__lt=seq).count() < seq - 1:
            raise EarlierStepsMissing(f"request #{request_id}: step {seq} arrived before an earlier one")
        target = _target_for(kill_request, event)
        step = KillStep.objects.create(
            request=kill_request, target=target, seq=seq, **step_columns(parsed, event), **(signed or {}),
        )
        _APPLY.get(parsed.event, _logged)(kill_request, target, step, event)
    return step


def step_columns(parsed: ParsedEvent, event: dict[str, Any]) -> dict[str, Any]:
    """A step's columns as read from its report (``signed_reports`` reads them again from the signed text)."""
    return {
        "at": parsed.at,
        "event": parsed.event,
        "pid": event.get("pid") if isinstance(event.get("pid"), int) else None,
        "signal": _text(event.get("signal"), 8),
        "method": _text(event.get("method"), 8),
        "result": _text(event.get("result"), 16),
        "detail": _text(event.get("detail")),
        "raw": event,
    }


def _same_report(stored: Any, received: dict[str, Any]) -> bool:
    """Whether a report for a stored (request, seq) says the same (a repeat answer may reword its detail)."""
    if not isinstance(stored, dict):
        return False
    repeat = bool(received.get("duplicate")) or bool(stored.get("duplicate"))
    ignored = _REPEAT_ANSWER_KEYS if repeat else _REPEAT_ANSWER_KEYS - {"detail"}

    def comparable(report: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in report.items() if key not in ignored}

    return comparable(stored) == comparable(received)


def _record_conflict(kill_request: KillRequest, stored: KillStep, received: dict[str, Any]) -> None:
    """Two different reports for one step: the first stays, the second is kept in the audit log."""
    logger.warning("kill request #%s: a report for step %s differs from the stored one", kill_request.pk,
                   stored.seq)
    audit(Action.REPORT_CONFLICT, kill_request, details={
        "seq": stored.seq,
        "stored": clip(json.dumps(stored.raw, sort_keys=True, default=str), 2000),
        "received": clip(json.dumps(received, sort_keys=True, default=str), 2000),
    })


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


def _move(kill_request: KillRequest, to: Status, details: dict[str, Any]) -> bool:
    """Move the request to ``to``, the status a report shows, if it may; whether it did (the caller saves).

    Along the transition table, or correcting an expiry the report disproves (``_correct_expiry``).
    """
    if _correct_expiry(kill_request, to, details):
        return True
    if not can_transition(kill_request.status, to):
        return False
    kill_request.transition(to)
    return True


def _correct_expiry(kill_request: KillRequest, to: Status, details: dict[str, Any]) -> bool:
    """Move an expiry the report disproves (``KillRequest.corrects_expiry``) to ``to``; whether it did.

    The step's audit ``details`` say so, since the hash-chained log is the record of every status change.
    """
    if not kill_request.corrects_expiry(to):
        return False
    details.update(was=Status(kill_request.status).value, status=to.value, why=LATE_REPORT_WHY)
    # Central's guess at the end; the "expired" audit event keeps it.
    kill_request.finished_at = None
    kill_request.result_detail = ""
    kill_request.transition(to, by_report=True)
    return True


def _run_seen(kill_request: KillRequest, details: dict[str, Any]) -> None:
    """Any step of a run shows the agent started, so a request expired for want of its "started"
    report is running after all. (An approved one still waits for its "started" to run.)"""
    if _correct_expiry(kill_request, Status.RUNNING, details):
        kill_request.save(update_fields=["status", "finished_at", "result_detail"])


def _started(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
             event: dict[str, Any]) -> None:
    details = _target_details(None, step, event)
    if _move(kill_request, Status.RUNNING, details):
        kill_request.started_at = step.at
        kill_request.save(update_fields=["status", "started_at", "finished_at", "result_detail"])
    elif kill_request.started_at is None:
        kill_request.started_at = step.at
        kill_request.save(update_fields=["started_at"])
    audit(Action.STARTED, kill_request, details=details)


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
    _run_seen(kill_request, details)
    audit(Action.SIGNAL_SENT, kill_request, details=details)


def _target_exited(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
                   event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.EXITED_NOT_REAPED if event.get("parent_pid") else Outcome.EXITED, step)
    details = _target_details(target, step, event)
    _run_seen(kill_request, details)
    audit(Action.TARGET_EXITED, kill_request, details=details)


def _target_survived(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
                     event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.SURVIVED, step)
        open_unkillable(kill_request, target, step)
    details = _target_details(target, step, event)
    _run_seen(kill_request, details)
    audit(Action.TARGET_SURVIVED, kill_request, details=details)


def _refused(kill_request: KillRequest, target: KillTarget | None, step: KillStep,
             event: dict[str, Any]) -> None:
    if target is not None:
        _set_outcome(target, Outcome.REFUSED, step)
    details = _target_details(target, step, event)
    _run_seen(kill_request, details)
    audit(Action.REFUSED, kill_request, details=details)


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
    details = _target_details(None, step, event)
    if _move(kill_request, status, details):
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


# --- the broker's side: only what the host's key signed counts -------------------------


def receive_report(message: Any, *, wait_for_earlier: bool = False) -> KillStep | None:
    """A report as it came off the broker; stored through ``record_progress`` once its signer is checked.

    Rejected (counted on the host, shown, audited; nothing else changes):
    unsigned, altered, signed by another key than the accepted key of the host
    the request is for, naming another host, or naming a request by a bare
    number or with a key that is not the request's.
    """
    try:
        checked = _checked_report(message)
    except trust.MessageRejected as rejected:
        _reject(rejected.reason, rejected.host_name, message)
        return None
    if checked is None:
        return None  # an order refusal: audited, nothing to store
    event, opened = checked
    return record_progress(event, wait_for_earlier=wait_for_earlier, signed=_signed_columns(message, opened))


def _signed_columns(message: dict[str, Any], opened: Opened) -> dict[str, str]:
    """The report as its host signed it, for the step's columns: verifiable again later without the broker."""
    return {"signed_text": opened.text, "signature": message["sig"], "signer_key": opened.public_key,
            "signer_fingerprint": opened.fingerprint}


def _checked_report(message: Any) -> tuple[dict[str, Any], Opened] | None:
    """The event in a report its request's host signed, and the opened envelope; None for an order
    refusal (handled here)."""
    try:
        opened = open_envelope(message, MessageKind.KILL_REPORT, max_text_chars=REPORT_MAX_CHARS)
    except BadMessage as error:
        raise trust.MessageRejected(f"kill report not signed by a host key: {error}",
                                    host_name=_claimed_report_host(message)) from None
    try:
        event = opened.body()
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise trust.MessageRejected("the signed kill report is not a JSON object")
    named_host = event.get("host")
    claimed_host = named_host if isinstance(named_host, str) else ""
    if event.get("event") == Event.ORDER_REFUSED:
        host = trust.signed_by_accepted_key(claimed_host, opened)
        _order_refused(event, host, opened)
        return None
    try:
        _parsed, request_id, order_key = _check(event)
    except BadEvent as error:
        raise trust.MessageRejected(f"kill report refused: {error}", host_name=claimed_host) from None
    kill_request = _ordered_request(request_id, order_key)
    if kill_request is None:
        raise trust.MessageRejected(
            f"kill report for request {clip(str(event.get('request_id')), 80)!r}, "
            "which central never ordered",
            host_name=claimed_host,
        )
    request_host = kill_request.host.name
    if not _is_for_host(kill_request, claimed_host):
        raise trust.MessageRejected(f"kill report for request #{request_id} (host {request_host}) names host "
                                    f"{clip(claimed_host, 100)!r}", host_name=request_host)
    try:
        trust.signed_by_accepted_key(request_host, opened)
    except trust.MessageRejected as rejected:
        raise trust.MessageRejected(f"kill report for request #{request_id}: {rejected.reason}",
                                    host_name=request_host) from None
    return event, opened


def _ordered_request(request_id: int, order_key: str) -> KillRequest | None:
    """The request (with its host) an order's request id names; None when central never ordered it."""
    kill_request = KillRequest.objects.select_related("host").filter(pk=request_id).first()
    return kill_request if kill_request is not None and kill_request.order_key == order_key else None


def _is_for_host(kill_request: KillRequest, host_name: str) -> bool:
    """Whether the request is one of ``host_name``'s: only its own host may report about it."""
    return kill_request.host.name == host_name


def _order_refused(event: dict[str, Any], host: Host, opened: Opened) -> None:
    """Write "order refused by host: <why>" to the audit log; no request changes (it may be forged).

    The refusal is attached to the request it names only when that request is
    the reporting host's: order keys travel on host queues that other hosts can
    read, so another host's refusal naming it is kept unattached, like one
    naming a request central never ordered. Repeats and floods are counted on
    the host and not written (``trust.count_order_refusal``).
    """
    host_name = host.name
    claimed = event.get("request_id")
    kill_request_id = None
    try:
        pk, order_key = KillRequest.parse_order_request_id(claimed)
    except ValueError:
        pass
    else:
        found = _ordered_request(pk, order_key)
        kill_request_id = found.pk if found is not None and _is_for_host(found, host_name) else None
    reason = clip(str(event.get("reason")), 40)
    detail = clip(str(event.get("detail")), DETAIL_MAX_CHARS)
    logger.warning("host %s refused an order (claimed request %r): %s: %s", host_name, claimed, reason,
                   detail)
    with transaction.atomic():
        counted = trust.count_order_refusal(host, opened, received_at=timezone.now())
        if counted is None:
            return
        log.record(Action.ORDER_REFUSED, host_name=host_name, kill_request_id=kill_request_id, details={
            "summary": f"order refused by host: {reason}: {clip(detail, 300)}",
            "reason": reason,
            "detail": detail,
            "claimed_request_id": clip(str(claimed), 140) if claimed is not None else None,
            "order_sha256": event.get("order_sha256") if isinstance(event.get("order_sha256"), str) else None,
            "at": clip(str(event.get("at")), 40),
            **counted,
        })


def _claimed_report_host(message: Any) -> str:
    """The host an unverifiable report is about: its request's host, or the name it gives (proves nothing)."""
    body: Any = message
    if isinstance(message, dict) and isinstance(message.get("text"), str):
        try:
            body = json.loads(message["text"][:REPORT_MAX_CHARS])
        except ValueError:
            return ""
    if not isinstance(body, dict):
        return ""
    request_id = body.get("request_id")
    number = request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else None
    if isinstance(request_id, str) and (match := re.match(r"^([0-9]{1,18})(?:-|$)", request_id)):
        number = int(match[1])
    if number is not None:
        kill_request = KillRequest.objects.select_related("host").filter(pk=number).first()
        if kill_request is not None:
            return kill_request.host.name
    host = body.get("host")
    return host if isinstance(host, str) else ""


def _reject(reason: str, host_name: str, message: Any) -> None:
    size = len(message["text"]) if isinstance(message, dict) and isinstance(message.get("text"), str) else 0
    trust.reject_message(SnapshotRejection.MessageKind.KILL_REPORT, reason, host_name=host_name,
                         size_bytes=size)
