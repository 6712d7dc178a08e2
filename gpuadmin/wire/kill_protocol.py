"""The kill protocol's words, defined once: what central orders and what the agent reports.

Both sides read them from here. The agent writes its events with
``event_record`` / ``finished_event``; central (``gpuadmin.kills``, the audit
log) builds its Django choices from ``Event``, maps each ``Result`` to a
request status, and reads every report with ``parse_event``. This module
imports no Django, so the agent can use it too. Adding an event or a result is
one edit here, plus the migration Django then asks for.

docs/kill-order.md describes the order and the events.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self

# The order format central writes, and the ones this agent executes. Version 2:
# every order is signed by central (gpuadmin/wire/signing.py); version 1 orders
# were not, and an agent refuses them.
ORDER_VERSION = 2
# A self-service order (a person stopping their own processes, no second admin): version 2
# plus its "self_service" block. Its own number, so an agent that predates it refuses it as
# an unsupported version instead of ignoring the block and skipping the uid check it asks for.
SELF_SERVICE_ORDER_VERSION = 3
ACCEPTED_ORDER_VERSIONS = frozenset({ORDER_VERSION, SELF_SERVICE_ORDER_VERSION})
# At most this many uids in a self-service order's "allowed_uids" (a person's accounts on one host).
MAX_SELF_SERVICE_UIDS = 64
# An order's deadline may lie at most this long after its approval: it bounds
# how long a captured order could be replayed at all (the journal refuses a
# replay within it), whatever central's settings say.
MAX_ORDER_WINDOW_SECONDS = 3600

# An order's ``host_deadline`` (its deadline moved onto the host's clock) may
# differ from its ``deadline`` by at most this much: a host whose clock is
# further off refuses the order as malformed (safe: nothing runs) rather than
# let a signature stretch an order's life.
MAX_HOST_CLOCK_OFFSET_SECONDS = 3600

# The signals a plan may use: the three that end a process, in escalation order,
# then SIGCHLD, which ends nothing. A plan of one SIGCHLD step "asks to reap": it
# nudges a parent that left zombies behind to wait() for them. It never
# escalates and is never combined with the others; a target still running
# after it is what was meant (outcome "asked"), not a survivor.
SIGNALS: dict[str, signal.Signals] = {
    "SIGINT": signal.SIGINT,
    "SIGTERM": signal.SIGTERM,
    "SIGKILL": signal.SIGKILL,
    "SIGCHLD": signal.SIGCHLD,
}
REAP_SIGNAL = "SIGCHLD"


def is_reap_plan(signal_names: list[str]) -> bool:
    """Whether a plan (its signals, in order) asks to reap rather than to end."""
    return signal_names == [REAP_SIGNAL]

# A request id names the agent's journal file, so it must be a safe file name
# (no '/', no leading '.'); orders are validated against the same rule.
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Action(StrEnum):
    """What an order asks of the host (its "action" key; absent means "kill", as every order before)."""

    KILL = "kill"  # signal the order's targets along its plan
    RESET_GPU = "reset_gpu"  # reset one GPU, named by UUID, once nothing holds it


# How long the agent lets a GPU reset run (nvidia-smi --gpu-reset) before calling it failed;
# central adds it to a reset request's finish deadline.
RESET_TIMEOUT_SECONDS = 120


class ResetRefusal(StrEnum):
    """Why the agent did not reset a GPU (the "reason" of a reset order's "finished" event)."""

    GPU_NOT_FOUND = "gpu_not_found"  # the backend lists no GPU with the order's UUID
    BACKEND_UNAVAILABLE = "backend_unavailable"  # no GPU backend to check the GPU with
    GPU_HELD = "gpu_held"  # a process is on the GPU (NVML) or holds its device file open
    MIG_IN_USE = "mig_in_use"  # MIG mode with instances: a reset of the whole GPU is refused
    VIRTUAL_MACHINE = "virtual_machine"  # a passthrough or vGPU device: a VM's GPU is not ours to reset
    DRIVER_REFUSED = "driver_refused"  # nvidia-smi (or the simulated driver) said no


class LabelledWord(StrEnum):
    """A word sent on the wire, with the label people read for it."""

    label: str

    def __new__(cls, value: str, label: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        return member

    @classmethod
    def members(cls) -> list[tuple[str, tuple[str, str]]]:
        """``[(NAME, (value, label)), ...]``: what Django's ``TextChoices(name, members)`` takes."""
        return [(member.name, (member.value, member.label)) for member in cls]


class Event(LabelledWord):
    """What the agent reports, one event at a time (the "event" key)."""

    STARTED = "started", "Started on host"
    SIGNAL_SENT = "signal_sent", "Signal sent"
    TARGET_EXITED = "target_exited", "Target exited"
    TARGET_SURVIVED = "target_survived", "Target survived"
    REFUSED = "refused", "Refused"
    FINISHED = "finished", "Finished"
    # Not a step of an order: the agent did not accept a message as an order at
    # all (forged, altered, replayed, for another host...). It changes no
    # request; central writes it to the audit log as "order refused by host".
    ORDER_REFUSED = "order_refused", "Order refused by host"


class Result(StrEnum):
    """How an order ended (the "result" of a "finished" event)."""

    SUCCEEDED = "succeeded"  # every target that was not refused is gone
    FAILED = "failed"  # some target could not be signalled (EPERM, changed mid-plan, ...)
    UNKILLABLE = "unkillable"  # some target was still alive after the last step
    REFUSED = "refused"  # every target refused, nothing signalled
    EXPIRED = "expired"  # received after the start deadline: nothing done
    INTERRUPTED = "interrupted"  # an earlier delivery started and never finished


class Outcome(StrEnum):
    """What became of one target (the "outcome" in a "finished" event's target summaries)."""

    EXITED = "exited"
    REFUSED = "refused"
    FAILED = "failed"
    SURVIVED = "survived"
    ASKED = "asked"  # a reap plan's target: signalled, and left running as meant


class Method(StrEnum):
    """How a signal was sent (the "method" key)."""

    PIDFD = "pidfd"
    KILL = "kill"  # os.kill fallback where pidfds are unavailable: a small race remains


class Refusal(StrEnum):
    """Why the agent will not signal a target (the "reason" of a "refused" event)."""

    PID_1 = "pid_1"
    KERNEL_THREAD = "kernel_thread"
    AGENT = "agent"
    AGENT_ANCESTOR = "agent_ancestor"
    NOT_A_PROCESS = "not_a_process"
    ZOMBIE = "zombie"
    IDENTITY_CHANGED = "identity_changed"
    PERMISSION_DENIED = "permission_denied"
    SIGNAL_ERROR = "signal_error"
    # The agent's protected executables (probe/kill/protected.py): by the executable it resolves itself.
    PROTECTED_EXECUTABLE = "protected_executable"
    UNVERIFIABLE_EXECUTABLE = "unverifiable_executable"
    # A self-service order's target whose uid, read from /proc before the signal, is not one the
    # order allows (the person's own accounts on this host).
    NOT_OWN_PROCESS = "not_own_process"


class OrderRefusal(StrEnum):
    """Why the agent did not accept a message as an order (the "reason" of an "order_refused" event)."""

    UNSIGNED = "unsigned"  # not a signed envelope at all
    BAD_SIGNATURE = "bad_signature"  # not signed by central's pinned key, or altered after signing
    NO_CENTRAL_KEY = "no_central_key"  # this agent has no central public key to verify with
    MALFORMED = "malformed"  # signed, but not a readable order
    UNSUPPORTED_VERSION = "unsupported_version"
    WRONG_HOST = "wrong_host"  # signed for another host
    EXPIRED = "expired"  # now is past its deadline
    WINDOW_TOO_LONG = "window_too_long"  # deadline - approved_at over MAX_ORDER_WINDOW_SECONDS
    CONFLICT = "conflict"  # another order under a request id this agent already executed


def order_refused_event(
    request_id: str | None, *, at: str, reason: OrderRefusal, detail: str, order_sha256: str | None = None
) -> dict[str, Any]:
    """The report of a message the agent did not accept as an order; ``request_id`` only as claimed."""
    return {
        "request_id": request_id,
        "seq": 0,
        "at": at,
        "event": Event.ORDER_REFUSED.value,
        "reason": reason.value,
        "detail": detail,
        "order_sha256": order_sha256,
    }


def event_record(
    request_id: str,
    *,
    seq: int,
    at: str,
    event: Event,
    pid: int | None = None,
    start_time_ticks: int | None = None,
    signal: str | None = None,
    method: Method | None = None,
    detail: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """One event as the agent journals and reports it: the keys every event has, then its own."""
    return {
        "request_id": request_id,
        "seq": seq,
        "at": at,
        "event": event.value,
        "pid": pid,
        "start_time_ticks": start_time_ticks,
        "signal": signal,
        "method": method.value if method else None,
        "detail": detail,
        **extra,
    }


def finished_event(
    request_id: str,
    *,
    seq: int,
    at: str,
    result: Result,
    detail: str,
    targets: list[dict[str, Any]] | None = None,
    duplicate: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """The last event of an order: its result, and one summary per target."""
    return event_record(
        request_id, seq=seq, at=at, event=Event.FINISHED, detail=detail, result=result.value,
        targets=targets or [], duplicate=duplicate, **extra,
    )


class BadEvent(ValueError):
    """A report that does not follow the protocol; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    """A report's keys that every event must carry, checked; the rest stays in ``raw``."""

    request_id: str | int
    seq: int
    event: Event
    at: datetime
    raw: dict[str, Any]

    @property
    def result(self) -> Result | None:
        """The result of a "finished" event; None when absent or not a word of this protocol."""
        value = self.raw.get("result")
        if not isinstance(value, str):
            return None
        try:
            return Result(value)
        except ValueError:
            return None


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise BadEvent(f"'at' must be an ISO 8601 time; got {value!r}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadEvent(f"'at' is not an ISO 8601 time: {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_event(raw: Any) -> ParsedEvent:
    """A reported event, checked, or BadEvent; the request id is left for the receiver to resolve."""
    if not isinstance(raw, dict):
        raise BadEvent(f"a progress event must be an object; got {type(raw).__name__}")
    request_id = raw.get("request_id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        raise BadEvent(f"'request_id' must be a string or an integer; got {request_id!r}")
    seq = raw.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise BadEvent(f"'seq' must be a non-negative integer; got {seq!r}")
    try:
        # A look-up by value goes through the enum's metaclass; mypy reads the
        # members' two-argument __new__ into the call instead.
        kind = Event(raw.get("event"))  # type: ignore[call-arg,arg-type]
    except ValueError:
        raise BadEvent(f"unknown event {raw.get('event')!r}") from None
    return ParsedEvent(request_id=request_id, seq=seq, event=kind, at=_parse_time(raw.get("at")), raw=raw)
