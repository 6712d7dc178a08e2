"""Each audit event as one sentence a person can read, built from its fields.

``describe(event, context)`` returns a sentence as a tuple of ``Part``s: our
own words, and values that came from a person or a process (names, reasons,
the agent's details), kept apart so that every page shows the latter with
their control characters visible (``gpuadmin_format.sentence_html``) and the
CSV export and the API write them as escapes (``sentence_text``). A sentence is
never stored and never built from stored HTML: the hashed fields are the
evidence, the sentence only reads them.

Every ``Action`` has a builder in ``_BUILDERS`` (tests/audit/test_sentences.py
fails for one without). An event's details are read defensively: they are
whatever was written at the time, and an old event must still read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.urls import NoReverseMatch, reverse

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.kills import plans
from gpuadmin.text import human_bytes, process_state, utc_text
from gpuadmin.untrusted_text import visible_text
from gpuadmin.wire.kill_protocol import Method, OrderRefusal, Outcome, Refusal, Result

# Part kinds. WORD is ours; the rest carry text from people or processes.
WORD = "word"
VALUE = "value"  # a name: host, person, process, user
QUOTE = "quote"  # a person's reason, in quotes
NOTE = "note"  # the agent's own words about a step, after a dash
CODE = "code"  # a signal, a plan, a queue: ours, shown as code
TIME = "time"  # a moment: UTC in text, the lab's time zone on the page (gpuadmin_format.moment)


@dataclass(frozen=True, slots=True)
class Part:
    text: str
    kind: str = WORD
    url: str = ""
    moment: datetime | None = None

    @property
    def untrusted(self) -> bool:
        return self.kind in (VALUE, QUOTE, NOTE)


Sentence = tuple[Part, ...]

# Why the agent would not touch a target, worded to follow "refused to signal PID n: ".
REFUSAL_WORDS: dict[Refusal, str] = {
    Refusal.PID_1: "it is PID 1",
    Refusal.KERNEL_THREAD: "it is a kernel thread",
    Refusal.AGENT: "it is the agent itself",
    Refusal.AGENT_ANCESTOR: "it is an ancestor of the agent",
    Refusal.NOT_A_PROCESS: "no such process",
    Refusal.ZOMBIE: "it is already a zombie",
    Refusal.IDENTITY_CHANGED: "it is no longer the process that was approved",
    Refusal.PERMISSION_DENIED: "permission denied",
    Refusal.SIGNAL_ERROR: "the signal could not be sent",
    Refusal.PROTECTED_EXECUTABLE: "its executable is on the host's protected list",
    Refusal.UNVERIFIABLE_EXECUTABLE: "its executable could not be read to check the protected list",
    Refusal.NOT_OWN_PROCESS: "a self-service order may stop only its person's own processes (by uid)",
}

# How an order ended, worded to follow "#n ".
RESULT_WORDS: dict[Result, str] = {
    Result.SUCCEEDED: "succeeded",
    Result.FAILED: "failed",
    Result.UNKILLABLE: "ended with targets still alive",
    Result.REFUSED: "was refused by the agent",
    Result.EXPIRED: "expired on the host before it started",
    Result.INTERRUPTED: "was interrupted on the host",
}

# Why the agent would not take a message as an order, worded to follow "refused an order: ".
ORDER_REFUSAL_WORDS: dict[OrderRefusal, str] = {
    OrderRefusal.UNSIGNED: "it was not signed",
    OrderRefusal.BAD_SIGNATURE: "its signature is not central's",
    OrderRefusal.NO_CENTRAL_KEY: "the agent has no central key to check it with",
    OrderRefusal.MALFORMED: "it could not be read",
    OrderRefusal.UNSUPPORTED_VERSION: "its version is not one the agent runs",
    OrderRefusal.WRONG_HOST: "it is for another host",
    OrderRefusal.EXPIRED: "it arrived after its deadline",
    OrderRefusal.WINDOW_TOO_LONG: "its deadline is too long after its approval",
    OrderRefusal.CONFLICT: "another order already ran under its request id",
}

# A target summary's outcome, worded to follow a count.
OUTCOME_WORDS: dict[Outcome, str] = {
    Outcome.EXITED: "gone",
    Outcome.REFUSED: "refused",
    Outcome.FAILED: "could not be signalled",
    Outcome.SURVIVED: "survived",
    Outcome.ASKED: "asked to reap their children",
}


@dataclass
class SentenceContext:
    """What a sentence may borrow from other events: the request's reason and plan, GPU names.

    Built once per page (or CSV chunk) by ``context_for``; a sentence without
    it is still complete, only shorter.
    """

    # kill request id -> the details of its "requested" event
    requests: dict[int, dict[str, Any]] = field(default_factory=dict)
    # GPU uuid -> "GPU 0"
    gpu_names: dict[str, str] = field(default_factory=dict)


def context_for(events: Iterable[AuditEvent]) -> SentenceContext:
    """The context for a batch of events: two queries, whatever the batch size."""
    from gpuadmin.fleet.models import Gpu

    ids: set[int] = set()
    uuids: set[str] = set()
    for event in events:
        if event.kill_request_id is not None:
            ids.add(event.kill_request_id)
        if event.action == Action.MEMORY_RELEASED:
            per_gpu = _dict(event.details).get("per_gpu")
            uuids.update(str(u) for u in _dict(per_gpu))
    context = SentenceContext()
    if ids:
        requested = AuditEvent.objects.filter(action=Action.REQUESTED, kill_request_id__in=ids)
        for request_id, details_json in requested.values_list("kill_request_id", "details_json"):
            context.requests.setdefault(request_id, _dict(json.loads(details_json)))
    if uuids:
        for uuid, index in Gpu.objects.filter(uuid__in=uuids).values_list("uuid", "index"):
            context.gpu_names[uuid] = f"GPU {index}"
    return context


def describe(event: AuditEvent, context: SentenceContext | None = None) -> Sentence:
    """The event as one sentence."""
    builder = _BUILDERS.get(event.action, _unknown)
    parts = [p for p in builder(event, _dict(event.details), context or SentenceContext()) if p.text]
    return tuple(parts)


def described(events: Iterable[AuditEvent]) -> list[AuditEvent]:
    """The events, each with ``.sentence`` set, sharing one context."""
    events = list(events)
    context = context_for(events)
    for event in events:
        event.sentence = describe(event, context)
    return events


def sentence_text(sentence: Sentence) -> str:
    """The sentence as plain text (CSV, API): control characters written as escapes, times in UTC."""
    out: list[str] = []
    for part in sentence:
        text = visible_text(part.text) if part.untrusted else part.text
        if part.kind == QUOTE:
            text = f"“{text}”"
        elif part.kind == NOTE:
            text = f" — {text}"
        elif part.kind == TIME and part.moment is not None:
            text = utc_text(part.moment, timespec="seconds")
        out.append(text)
    return "".join(out)


# --- building blocks ------------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _url(name: str, *args: Any) -> str:
    try:
        return reverse(name, args=args)
    except NoReverseMatch:  # a host name no URL can hold ("a/b"): the name alone, unlinked
        return ""


def w(text: str) -> Part:
    return Part(text)


def value(text: Any, url: str = "") -> Part:
    return Part(str(text), VALUE, url)


def quote(text: str) -> Part:
    return Part(text, QUOTE)


def note(text: str) -> Part:
    return Part(text, NOTE)


def code(text: str) -> Part:
    return Part(text, CODE)


def when(moment: datetime | None) -> Part:
    return Part(utc_text(moment, timespec="seconds") if moment else "", TIME, moment=moment)


def _request(event: AuditEvent) -> list[Part]:
    if event.kill_request_id is None:
        return [w("a kill request")]
    return [Part(f"#{event.kill_request_id}", url=_url("kill_request_detail", event.kill_request_id))]


def _host(event: AuditEvent) -> list[Part]:
    if not event.host_name:
        return [w("the host")]
    return [value(event.host_name, _url("host_detail", event.host_name))]


def _actor(event: AuditEvent) -> list[Part]:
    return [value(event.actor_name)] if event.actor_name else [w("central")]


def _target(details: Mapping[str, Any]) -> list[Part]:
    pid = _int(details.get("pid"))
    parts = [w(f"PID {pid}" if pid is not None else "a target")]
    if _str(details.get("name")):
        parts += [w(" "), value(details["name"])]
    if _str(details.get("user")):
        parts += [w(" ("), value(details["user"]), w(")")]
    return parts


def _plan(raw: Any) -> list[Part]:
    try:
        return [w(" — plan "), code(plans.describe(plans.validate_plan(raw)))]
    except (plans.PlanError, KeyError, TypeError):
        return []


def _agent_detail(details: Mapping[str, Any]) -> list[Part]:
    return [note(details["detail"])] if _str(details.get("detail")) else []


def _requested_by(event: AuditEvent, context: SentenceContext, *, with_reason: bool = True) -> list[Part]:
    reason = _str(context.requests.get(event.kill_request_id or 0, {}).get("reason"))
    if not event.requester_name:
        return [w(" ("), quote(reason), w(")")] if with_reason and reason else []
    parts = [w(" (requested by "), value(event.requester_name)]
    if with_reason and reason:
        parts += [w(": "), quote(reason)]
    return [*parts, w(")")]


# --- one builder per action --------------------------------------------------------------------

Builder = Callable[[AuditEvent, dict[str, Any], SentenceContext], list[Part]]


def _requested(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" requested "), *_request(event)]
    gpu = details.get("gpu")
    if details.get("action") == "reset_gpu" and isinstance(gpu, dict):
        # A GPU reset request (gpuadmin/kills: no targets, one GPU by UUID).
        parts += [w(f": reset GPU {_int(gpu.get('index'))} "), value(_str(gpu.get("uuid")))]
    else:
        parts.append(w(": kill "))
        parts += [value(event.targets_summary)] if event.targets_summary else [w("its targets")]
    parts += [w(" on "), *_host(event)]
    memory = _int(details.get("gpu_memory_bytes"))
    if memory:
        parts.append(w(f", holding {human_bytes(memory)} of GPU memory"))
    if _str(details.get("reason")):
        parts += [w(": "), quote(details["reason"])]
    parts += _plan(details.get("plan"))
    excluded = details.get("excluded")
    if isinstance(excluded, list) and excluded:
        parts.append(w(f"; {len(excluded)} process{'es' if len(excluded) > 1 else ''} left out"))
    warnings = details.get("warnings")
    if isinstance(warnings, list) and warnings:
        parts.append(w(f"; {len(warnings)} warning{'s' if len(warnings) > 1 else ''}"))
    return parts


def _approved(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" approved "), *_request(event), *_requested_by(event, context)]
    parts += _plan(context.requests.get(event.kill_request_id or 0, {}).get("plan"))
    if details.get("self_service"):
        uids = details.get("allowed_uids")
        shown = ", ".join(str(u) for u in uids) if isinstance(uids, list) else "?"
        parts.append(w(f"; self-service: the owner stopping their own processes, no second admin "
                       f"(the agent signals only uid {shown})"))
    elif details.get("self_approved"):
        parts.append(w("; approved by its own requester (self-approval is allowed here)"))
    if details.get("sigkill_only_allowed"):
        parts.append(w("; SIGKILL only, allowed by the approver"))
    changes = _dict(details.get("changes_since_request"))
    for pid, said in sorted(changes.items()):
        if isinstance(said, list) and said:
            parts += [w(f"; changed since the request, PID {pid}: "), value("; ".join(map(str, said)))]
    deadline = _moment(details.get("start_deadline"))
    if deadline:
        parts += [w("; to start by "), when(deadline)]
    return parts


def _rejected(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" rejected "), *_request(event), *_requested_by(event, context,
                                                                               with_reason=False)]
    if _str(details.get("reason")):
        parts += [w(": "), quote(details["reason"])]
    return parts


def _cancelled(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" cancelled "), *_request(event)]
    if event.requester_name and event.requester_name != event.actor_name:
        parts += _requested_by(event, context, with_reason=False)
    if _str(details.get("was")):
        parts.append(w(f" while it was {details['was']}"))
    if _str(details.get("reason")):
        parts += [w(": "), quote(details["reason"])]
    return parts


def _expired(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_request(event), w(" expired")]
    if _str(details.get("why")):
        parts.append(w(f": {details['why']}"))
    deadline = _moment(details.get("deadline"))
    if deadline:
        parts += [w(" (deadline "), when(deadline), w(")")]
    return parts


def _dispatched(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [w("central sent the order of "), *_request(event), w(" to "), *_host(event)]
    attempt = _int(details.get("attempt"))
    if attempt and attempt > 1:
        parts.append(w(f" (attempt {attempt})"))
    deadline = _moment(details.get("deadline"))
    if deadline:
        parts += [w("; it must start by "), when(deadline)]
    return parts


def _started(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    return [*_host(event), w(" started "), *_request(event), *_agent_detail(details)]


def _signal_sent(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_host(event), w(" sent "), code(_str(details.get("signal")) or "a signal"), w(" to "),
             *_target(details)]
    if details.get("method") == Method.KILL:
        parts.append(w(" with kill(): pidfds were unavailable"))
    return parts


def _target_exited(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_target(details), w(" exited")]
    parts += [w(" after "), code(details["signal"])] if _str(details.get("signal")) else [
        w(" before any signal")]
    parent = _int(details.get("parent_pid"))
    if parent is not None:
        parts.append(w(f", not yet reaped by its parent PID {parent}"))
    return [*parts, *_agent_detail(details)]


def _target_survived(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_target(details), w(" survived ")]
    parts.append(code(details["signal"]) if _str(details.get("signal")) else w("the plan"))
    if _str(details.get("state")):
        parts.append(w(f", still {process_state(details['state'])}"))
    return [*parts, *_agent_detail(details)]


def _refused(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_host(event), w(" refused to signal "), *_target(details)]
    try:
        parts.append(w(f": {REFUSAL_WORDS[Refusal(_str(details.get('reason')))]}"))
    except ValueError:
        if _str(details.get("reason")):
            parts += [w(": "), value(details["reason"])]
    return [*parts, *_agent_detail(details)]


def _finished(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    result = _str(details.get("result"))
    if details.get("by"):  # central gave up waiting for the agent (services/sweeper.py)
        return [w("central marked "), *_request(event), w(f" {result or 'failed'}"), *_agent_detail(details)]
    try:
        words = RESULT_WORDS[Result(result)]
    except ValueError:
        words = "finished"
    parts = [*_request(event), w(f" {words}")]
    targets = [t for t in details.get("targets", ()) if isinstance(t, dict)] if isinstance(
        details.get("targets"), list) else []
    if targets:
        counts: dict[str, int] = {}
        for target in targets:
            counts[_str(target.get("outcome"))] = counts.get(_str(target.get("outcome")), 0) + 1
        gone = counts.pop(Outcome.EXITED.value, 0)
        tally = [f"{gone} of {len(targets)} target{'s' if len(targets) > 1 else ''} gone"]
        for outcome in Outcome:
            if counts.get(outcome.value):
                tally.append(f"{counts.pop(outcome.value)} {OUTCOME_WORDS[outcome]}")
        if sum(counts.values()):
            tally.append(f"{sum(counts.values())} without an outcome")
        parts.append(w(": " + ", ".join(tally)))
    if details.get("duplicate"):
        parts.append(w(" (answered again for a repeated delivery; nothing ran twice)"))
    return [*parts, *_agent_detail(details)]


def _memory_released(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    released = _int(details.get("released_bytes"))
    expected = _int(details.get("expected_bytes"))
    parts = [w(f"{human_bytes(released)} of GPU memory back on "), *_host(event), w(" after "),
             *_request(event)]
    per_gpu = _dict(details.get("per_gpu"))
    if per_gpu:
        pieces = []
        for uuid, figures in sorted(per_gpu.items()):
            name = context.gpu_names.get(uuid, uuid)
            pieces.append(f"{name}: {human_bytes(_int(_dict(figures).get('released_bytes')))}")
        parts.append(w(f" ({'; '.join(pieces)})"))
    if expected is not None and released is not None and released < expected:
        parts.append(w(f"; {human_bytes(expected)} was expected"))
    still = details.get("still_holding")
    if isinstance(still, list) and still:
        pids = ", ".join(str(ident).split(":")[0] for ident in still)
        parts.append(w(f"; still held by PID {pids}"))
    taken_at = _moment(details.get("snapshot_taken_at"))
    if taken_at:
        parts += [w(", confirmed by the snapshot taken at "), when(taken_at)]
    return parts


def _order_refused(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    # Written from what the host said; the request it names may be forged (kill_request_id is
    # set only when the id and its order key match a real request).
    parts = [*_host(event), w(" refused ")]
    if event.kill_request_id is not None:
        parts += [w("the order of "), *_request(event)]
    elif _str(details.get("claimed_request_id")):
        parts += [w("a message naming request "), value(details["claimed_request_id"])]
    else:
        parts.append(w("a message as an order"))
    try:
        parts.append(w(f": {ORDER_REFUSAL_WORDS[OrderRefusal(_str(details.get('reason')))]}"))
    except ValueError:
        if _str(details.get("reason")):
            parts += [w(": "), value(details["reason"])]
    skipped = _int(details.get("not_written_before"))
    if skipped:
        # fleet.intake.trust.count_order_refusal: repeats and floods are counted on the host, not written.
        parts.append(w(f" ({skipped} more refusal{'s' if skipped > 1 else ''} from this host since the "
                       "previous one were counted but not written: repeats, or over the limit)"))
    return [*parts, *_agent_detail(details)]


def _report_conflict(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    seq = _int(details.get("seq"))
    step = f"step {seq}" if seq is not None else "a step"
    return [*_host(event), w(f" sent a second, different report for {step} of "), *_request(event),
            w("; the first one stands and both are kept here")]


def _fingerprint(details: Mapping[str, Any]) -> list[Part]:
    return [w(" "), code(details["fingerprint"])] if _str(details.get("fingerprint")) else []


def _host_key_offered(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    return [*_host(event), w(" offered key"), *_fingerprint(details), w("; it waits for an approver")]


def _host_accepted(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    actor = [value(details["by"])] if _str(details.get("by")) else _actor(event)
    return [*actor, w(" accepted the key"), *_fingerprint(details), w(" of "), *_host(event)]


def _host_key_forgotten(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    actor = [value(details["by"])] if _str(details.get("by")) else _actor(event)
    parts = [*actor, w(" forgot the key"), *_fingerprint(details), w(" of "), *_host(event)]
    if details.get("was_accepted") is False:
        parts.append(w(" (never accepted)"))
    return [*parts, w("; its next snapshot offers a key again")]


def _message_rejected(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    kinds = {"snapshot": "a snapshot", "kill_report": "a kill report"}
    kind = kinds.get(_str(details.get("kind")), "a message")
    parts = [w(f"central rejected {kind} naming "), *_host(event)]
    if _str(details.get("reason")):
        parts += [w(": "), note(details["reason"])]
    count = _int(details.get("rejected_so_far"))
    if count and count > 1:
        parts.append(w(f" ({count} rejected so far; at most one such event a minute is written)"))
    return parts


# --- accounts, roles, tokens, sign-in (gpuadmin/accounts/audit_trail.py) -------------------
# The account concerned is details["user"]; the actor is who changed it ("central" when a
# command or a signal outside a request did).


def _account(details: Mapping[str, Any]) -> list[Part]:
    return [w("account "), value(details["user"])] if _str(details.get("user")) else [w("an account")]


def _names(raw: Any) -> str:
    return ", ".join(str(n) for n in raw) if isinstance(raw, list) else ""


def _user_created(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" created "), *_account(details)]
    if details.get("is_superuser"):
        parts.append(w(" (superuser)"))
    if details.get("is_active") is False:
        parts.append(w(" (inactive)"))
    return parts


def _user_changed(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" changed "), *_account(details)]
    changed = _names(details.get("changed"))
    return [*parts, w(f": {changed}")] if changed else parts


def _user_deleted(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    return [*_actor(event), w(" deleted "), *_account(details)]


def _roles_changed(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event)]
    if _names(details.get("added")):
        parts += [w(" gave "), *_account(details), w(" the role(s) "), code(_names(details["added"]))]
    elif _names(details.get("removed")):
        parts += [w(" took the role(s) "), code(_names(details["removed"])), w(" from "), *_account(details)]
    else:
        parts += [w(" changed the roles of "), *_account(details)]
    now = _names(details.get("roles"))
    return [*parts, w("; now "), code(now)] if now else [*parts, w("; now no role")]


def _token_created(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [*_actor(event), w(" created API token "), code(_str(details.get("token")) or "?"), w(" for "),
             *_account(details)]
    expires = _moment(details.get("expires"))
    return [*parts, w(", valid until "), when(expires)] if expires else [*parts, w(", without expiry")]


def _token_revoked(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    verb = " expired" if details.get("reason") == "expired" else " revoked"
    return [w("API token "), code(_str(details.get("token")) or "?"), w(" of "), *_account(details), w(verb)]


def _totp_device_added(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    return [*_actor(event), w(" added TOTP device "), value(_str(details.get("device")) or "?"), w(" to "),
            *_account(details)]


def _totp_device_removed(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    return [*_actor(event), w(" removed TOTP device "), value(_str(details.get("device")) or "?"),
            w(" from "), *_account(details)]


def _login_locked_out(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [w("sign-in locked out for "), *_account(details)]
    if _str(details.get("address")):
        parts += [w(" from "), value(details["address"])]
    return [*parts, w(" after too many failed attempts")]


def _reauthenticated(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    how = "password and TOTP code" if details.get("totp") else "password"
    return [*_account(details), w(f" confirmed its {how} to approve")]


def _policy_changed(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    policy = _dict(details.get("policy"))
    what = f"{_str(policy.get('condition'))}, {_str(policy.get('mode'))}"
    return [*_actor(event), w(f" {_str(details.get('change')) or 'changed'} fair-use policy "),
            value(_str(policy.get("name"))), note(what)]


def _fair_use_step(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    parts = [w("Fair-use policy "), value(_str(details.get("policy"))), w(f": {_str(details.get('step'))} ")]
    parts.append(quote(_str(details.get("summary"))))
    if details.get("reason"):
        parts += [w(" because "), quote(_str(details.get("reason")))]
    return [*parts, w(" on "), *_host(event)]


def _unknown(event: AuditEvent, details: dict[str, Any], context: SentenceContext) -> list[Part]:
    # An action no builder knows (only reachable for rows written by another version).
    parts = [*_request(event), w(f": {event.action}")]
    return [*parts, note(event.details_text)] if details else parts


_BUILDERS: dict[str, Builder] = {
    Action.REQUESTED: _requested,
    Action.APPROVED: _approved,
    Action.REJECTED: _rejected,
    Action.CANCELLED: _cancelled,
    Action.EXPIRED: _expired,
    Action.DISPATCHED: _dispatched,
    Action.STARTED: _started,
    Action.SIGNAL_SENT: _signal_sent,
    Action.TARGET_EXITED: _target_exited,
    Action.TARGET_SURVIVED: _target_survived,
    Action.REFUSED: _refused,
    Action.FINISHED: _finished,
    Action.MEMORY_RELEASED: _memory_released,
    Action.ORDER_REFUSED: _order_refused,
    Action.REPORT_CONFLICT: _report_conflict,
    Action.HOST_KEY_OFFERED: _host_key_offered,
    Action.HOST_ACCEPTED: _host_accepted,
    Action.HOST_KEY_FORGOTTEN: _host_key_forgotten,
    Action.MESSAGE_REJECTED: _message_rejected,
    Action.USER_CREATED: _user_created,
    Action.USER_CHANGED: _user_changed,
    Action.USER_DELETED: _user_deleted,
    Action.ROLES_CHANGED: _roles_changed,
    Action.TOKEN_CREATED: _token_created,
    Action.TOKEN_REVOKED: _token_revoked,
    Action.TOTP_DEVICE_ADDED: _totp_device_added,
    Action.TOTP_DEVICE_REMOVED: _totp_device_removed,
    Action.LOGIN_LOCKED_OUT: _login_locked_out,
    Action.REAUTHENTICATED: _reauthenticated,
    Action.POLICY_CHANGED: _policy_changed,
    Action.FAIR_USE_STEP: _fair_use_step,
}


def has_sentence(action: str) -> bool:
    return action in _BUILDERS
