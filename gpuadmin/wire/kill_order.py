"""A kill order as the agent receives it: its signature, and its validation.

The order is a self-contained JSON document built by central after a second
admin approved the request (docs/kill-order.md), signed with central's key.
``verify_order`` runs before anything else: only an order central signed, for
this host, of a version this agent runs, before its deadline, with a deadline
close to its approval, is handed on. Even then the agent trusts nothing in it
beyond its shape: identities are checked against /proc right before each
signal, and the protected processes are refused whatever the order says.
Unknown keys are ignored so central can add fields; every key listed here is
required and checked.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from signal import Signals
from typing import Any, cast

from gpuadmin.wire.kill_protocol import (
    ACCEPTED_ORDER_VERSIONS,
    MAX_HOST_CLOCK_OFFSET_SECONDS,
    MAX_ORDER_WINDOW_SECONDS,
    MAX_SELF_SERVICE_UIDS,
    REAP_SIGNAL,
    REQUEST_ID_PATTERN,
    SELF_SERVICE_ORDER_VERSION,
    SIGNALS,
    Action,
    OrderRefusal,
    is_reap_plan,
)
from gpuadmin.wire.signing import BadMessage, MessageKind, open_envelope

# Outer bounds only: central applies the lab's tighter plan bounds.
MAX_STEPS = 10
MAX_GRACE_SECONDS = 3600
MAX_TARGETS = 10_000
SHA256_HEX_PATTERN = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class Target:
    """One process: a PID *and* its start time on one boot (PIDs are reused)."""

    pid: int
    start_time_ticks: int
    uid: int
    user: str
    name: str
    cmdline_sha256: str


@dataclass(frozen=True, slots=True)
class PlanStep:
    signal: str
    grace_seconds: float

    # Signals, not signal.Signals: in this class body `signal` is the field above.
    @property
    def signum(self) -> Signals:
        return SIGNALS[self.signal]


@dataclass(frozen=True, slots=True)
class Order:
    order_version: int
    request_id: str
    host: str
    boot_id: str
    deadline: datetime
    targets: tuple[Target, ...]
    plan: tuple[PlanStep, ...]
    approved_by: str
    approved_at: str
    approved_at_time: datetime
    # The start deadline on this host's own clock, as central estimated it from
    # the host's last snapshot (``deadline`` moved by the host's clock offset);
    # ``deadline`` itself when central sent none. Only this is compared with
    # this host's clock, so a clock ahead or behind neither expires a fresh
    # order nor runs a late one.
    host_deadline: datetime
    # "kill" (every order before reset orders: the key is absent) or "reset_gpu", which
    # names one GPU (``gpu_uuid``) and has no targets and no plan.
    action: Action = Action.KILL
    gpu_uuid: str = ""
    # A self-service order (its "self_service" block): a person stopping their own processes with
    # no second admin. The agent signals a target only while /proc shows its uid among these
    # (identity.observe, before every signal); None for every other order.
    self_service_uids: frozenset[int] | None = None
    self_service_person: str = ""

    def expired_at(self, now: float) -> bool:
        """Whether ``now`` (this host's clock) is past the order's start deadline."""
        return now > self.host_deadline.timestamp()

    @property
    def asks_to_reap(self) -> bool:
        """A plan of one SIGCHLD: ask the targets to reap their children; nothing is meant to end."""
        return is_reap_plan([step.signal for step in self.plan])

    def describe_plan(self) -> str:
        """'SIGINT → 10 s → SIGTERM → 20 s → SIGKILL → 30 s', or the GPU reset."""
        if self.action is Action.RESET_GPU:
            return f"reset of GPU {self.gpu_uuid}"
        return " → ".join(f"{step.signal} → {step.grace_seconds:g} s" for step in self.plan)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise ValueError(f"{where}: missing {key!r}")
    return raw[key]


def _text(raw: dict[str, Any], key: str, where: str, *, allow_empty: bool = False) -> str:
    value = _require(raw, key, where)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key!r} must be a string; got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{where}: {key!r} must not be empty")
    return value


def _utc_time(raw: dict[str, Any], key: str, where: str) -> datetime:
    text = _text(raw, key, where)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{where}: {key!r} is not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        # A naive time would be read in the host's local zone: an absolute
        # deadline must not depend on where the agent runs.
        raise ValueError(f"{where}: {key!r} must carry a UTC offset (e.g. 'Z'): {text!r}")
    return moment


def _target(raw: Any, number: int) -> Target:
    where = f"target {number}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object; got {type(raw).__name__}")
    pid = _require(raw, "pid", where)
    if not _is_int(pid) or pid < 1:
        raise ValueError(f"{where}: 'pid' must be a positive integer; got {pid!r}")
    start_time_ticks = _require(raw, "start_time_ticks", where)
    if not _is_int(start_time_ticks) or start_time_ticks < 0:
        raise ValueError(
            f"{where}: 'start_time_ticks' must be an integer of 0 or more; got {start_time_ticks!r}"
        )
    uid = _require(raw, "uid", where)
    if not _is_int(uid) or uid < 0:
        raise ValueError(f"{where}: 'uid' must be a non-negative integer; got {uid!r}")
    digest = _text(raw, "cmdline_sha256", where)
    if not SHA256_HEX_PATTERN.match(digest):
        raise ValueError(f"{where}: 'cmdline_sha256' must be 64 lowercase hex digits; got {digest!r}")
    return Target(
        pid=pid,
        start_time_ticks=start_time_ticks,
        uid=uid,
        user=_text(raw, "user", where, allow_empty=True),
        name=_text(raw, "name", where, allow_empty=True),
        cmdline_sha256=digest,
    )


def _step(raw: Any, number: int) -> PlanStep:
    where = f"plan step {number}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object like {{'signal': 'SIGINT', 'grace_seconds': 10}}")
    name = _require(raw, "signal", where)
    if name not in SIGNALS:
        raise ValueError(f"{where}: signal must be one of {', '.join(SIGNALS)}; got {name!r}")
    grace = _require(raw, "grace_seconds", where)
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise ValueError(f"{where}: 'grace_seconds' must be a number; got {grace!r}")
    if not 0 < grace <= MAX_GRACE_SECONDS:  # also false for NaN
        raise ValueError(f"{where}: 'grace_seconds' must be over 0, at most {MAX_GRACE_SECONDS}; got {grace}")
    return PlanStep(signal=name, grace_seconds=float(grace))


def _plan(raw: Any) -> tuple[PlanStep, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'plan' must be a non-empty list of steps")
    if len(raw) > MAX_STEPS:
        raise ValueError(f"'plan' has {len(raw)} steps; at most {MAX_STEPS}")
    plan = tuple(_step(step, number) for number, step in enumerate(raw, start=1))
    if len(plan) > 1 and any(step.signal == REAP_SIGNAL for step in plan):
        raise ValueError(f"{REAP_SIGNAL} asks a parent to reap its zombies: it must be the plan's only step")
    names = list(SIGNALS)
    for number, step in enumerate(plan, start=1):
        if step.signal == "SIGKILL" and number != len(plan):
            raise ValueError(f"plan step {number}: SIGKILL must be the last step; nothing can follow it")
        if number > 1 and names.index(step.signal) < names.index(plan[number - 2].signal):
            raise ValueError(
                f"plan step {number}: {step.signal} after {plan[number - 2].signal}; "
                "signals must escalate (SIGINT, then SIGTERM, then SIGKILL)"
            )
    return plan


def _targets(raw: Any) -> tuple[Target, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("'targets' must be a non-empty list")
    if len(raw) > MAX_TARGETS:
        raise ValueError(f"'targets' has {len(raw)} entries; at most {MAX_TARGETS}")
    targets = tuple(_target(target, number) for number, target in enumerate(raw, start=1))
    seen: set[int] = set()
    for target in targets:
        if target.pid in seen:
            raise ValueError(f"PID {target.pid} is listed twice in 'targets'")
        seen.add(target.pid)
    return targets


def _action(order: dict[str, Any]) -> Action:
    value = order.get("action", Action.KILL.value)
    try:
        return Action(value)
    except ValueError:
        words = ", ".join(action.value for action in Action)
        raise ValueError(f"order: 'action' must be one of {words}; got {value!r:.80}") from None


def _reset_gpu(order: dict[str, Any]) -> str:
    """The UUID of the GPU a reset order names; a reset order has no targets and no plan."""
    gpu = _require(order, "gpu", "order")
    if not isinstance(gpu, dict):
        raise ValueError("order: 'gpu' must be an object like {'uuid': 'GPU-...'}")
    uuid = _text(gpu, "uuid", "order.gpu")
    if len(uuid) > 128 or uuid != uuid.strip():
        raise ValueError(f"order.gpu: 'uuid' must be 1-128 characters, no spaces around; got {uuid!r:.140}")
    # Required and empty: an agent that predates reset orders ignores 'action' and refuses
    # the order as malformed (no targets), instead of reading it as a kill.
    if _require(order, "targets", "order") != [] or _require(order, "plan", "order") != []:
        raise ValueError("order: a reset_gpu order has empty 'targets' and 'plan'")
    return uuid


def _self_service(order: dict[str, Any], version: int, action: Action,
                  targets: tuple[Target, ...]) -> tuple[frozenset[int] | None, str]:
    """The uids a self-service order allows and whose order it is; (None, "") for any other order."""
    raw = order.get("self_service")
    if raw is None:
        if version == SELF_SERVICE_ORDER_VERSION:
            raise ValueError(f"order: version {version} is a self-service order; "
                             "its 'self_service' is missing")
        return None, ""
    where = "order.self_service"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object like {{'allowed_uids': [1000], 'person': 'alice'}}")
    if action is not Action.KILL:
        raise ValueError(f"{where}: only a kill may be self-service; got action {action.value!r}")
    uids = _require(raw, "allowed_uids", where)
    if not isinstance(uids, list) or not uids or len(uids) > MAX_SELF_SERVICE_UIDS:
        raise ValueError(f"{where}: 'allowed_uids' must be a list of 1 to {MAX_SELF_SERVICE_UIDS} uids")
    if not all(_is_int(uid) and uid >= 0 for uid in uids):
        raise ValueError(f"{where}: 'allowed_uids' must hold non-negative integers; got {uids!r:.200}")
    allowed = frozenset(uids)
    # Central checked the same before signing; a target outside them means the order is not what
    # a self-service order may be, whoever signed it.
    for target in targets:
        if target.uid not in allowed:
            raise ValueError(f"{where}: target PID {target.pid} has uid {target.uid}, not one of the "
                             f"allowed uids {sorted(allowed)}")
    return allowed, _text(raw, "person", where)


def validate_order(order: Any) -> Order:
    """The order as dataclasses, or ValueError saying what is wrong with it."""
    if not isinstance(order, dict):
        raise ValueError(f"a kill order must be a JSON object; got {type(order).__name__}")
    version = _require(order, "order_version", "order")
    if not _is_int(version) or version not in ACCEPTED_ORDER_VERSIONS:
        accepted = ", ".join(str(v) for v in sorted(ACCEPTED_ORDER_VERSIONS))
        raise ValueError(f"unsupported order_version {version!r}; this agent runs version {accepted} only")
    request_id = _require(order, "request_id", "order")
    if _is_int(request_id):
        request_id = str(request_id)
    if not isinstance(request_id, str) or not REQUEST_ID_PATTERN.match(request_id):
        raise ValueError(
            f"order: 'request_id' must be 1-128 letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit); got {request_id!r}"
        )
    approved_at = _utc_time(order, "approved_at", "order")
    deadline = _utc_time(order, "deadline", "order")
    host_deadline = _utc_time(order, "host_deadline", "order") if "host_deadline" in order else deadline
    if abs((host_deadline - deadline).total_seconds()) > MAX_HOST_CLOCK_OFFSET_SECONDS:
        raise ValueError(f"order: 'host_deadline' is more than {MAX_HOST_CLOCK_OFFSET_SECONDS} s away from "
                         "'deadline'; no clock offset that large is corrected")
    action = _action(order)
    if action is Action.RESET_GPU:
        gpu_uuid = _reset_gpu(order)
        targets: tuple[Target, ...] = ()
        plan: tuple[PlanStep, ...] = ()
    else:
        gpu_uuid = ""
        targets = _targets(_require(order, "targets", "order"))
        plan = _plan(_require(order, "plan", "order"))
    self_service_uids, self_service_person = _self_service(order, version, action, targets)
    return Order(
        order_version=version,
        request_id=request_id,
        host=_text(order, "host", "order"),
        boot_id=_text(order, "boot_id", "order").strip(),
        deadline=deadline,
        targets=targets,
        plan=plan,
        approved_by=_text(order, "approved_by", "order"),
        approved_at=approved_at.isoformat(),
        approved_at_time=approved_at,
        host_deadline=host_deadline,
        action=action,
        gpu_uuid=gpu_uuid,
        self_service_uids=self_service_uids,
        self_service_person=self_service_person,
    )


# --- the signature and the checks that come before anything else ----------------

# An order is a few KiB per thousand targets; anything far larger is not one.
MAX_ORDER_TEXT_CHARS = 4 * 1024 * 1024


class OrderRefused(Exception):
    """A delivered message this agent does not accept as an order; nothing was done."""

    def __init__(self, reason: OrderRefusal, detail: str, *, request_id: str | None = None,
                 order_sha256: str | None = None) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.request_id = request_id  # as the message claims it: never trusted, only reported
        self.order_sha256 = order_sha256


def _claimed_request_id(message: Any) -> str | None:
    """The request id a message claims, for the refusal report only (it proves nothing)."""
    body = message
    if isinstance(message, dict) and isinstance(message.get("text"), str):
        try:
            body = json.loads(message["text"][:MAX_ORDER_TEXT_CHARS])
        except ValueError:
            return None
    value = body.get("request_id") if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)[:128]


def verify_order(message: Any, *, central_key: str | None, host_name: str, now: float) -> dict[str, Any]:
    """The order in ``message`` once it passed every check below, or OrderRefused.

    In this order: a signed envelope; signed by central's pinned key (so not
    altered in any byte); a readable order of a version this agent runs; for
    this host; now <= host_deadline (the deadline on this host's clock);
    deadline - approved_at within
    MAX_ORDER_WINDOW_SECONDS. A replay inside that window is refused by the
    journal (same request id), outside it by the deadline.
    """
    claimed = _claimed_request_id(message)
    if not central_key:
        raise OrderRefused(OrderRefusal.NO_CENTRAL_KEY, "this agent has no central public key "
                           "(GPUADMIN_CENTRAL_PUBLIC_KEY) to verify orders with", request_id=claimed)
    if not isinstance(message, dict) or "sig" not in message:
        raise OrderRefused(OrderRefusal.UNSIGNED, "not a signed order; central signs every order",
                           request_id=claimed)
    try:
        opened = open_envelope(message, MessageKind.ORDER, trusted=central_key,
                               max_text_chars=MAX_ORDER_TEXT_CHARS)
    except BadMessage as error:
        raise OrderRefused(OrderRefusal.BAD_SIGNATURE, str(error), request_id=claimed) from None
    digest = hashlib.sha256(opened.text.encode("ascii")).hexdigest()

    def refused(reason: OrderRefusal, detail: str) -> OrderRefused:
        return OrderRefused(reason, detail, request_id=claimed, order_sha256=digest)

    try:
        order = opened.body()
    except ValueError as error:
        raise refused(OrderRefusal.MALFORMED, f"the signed text is not JSON: {error}") from None
    version = order.get("order_version") if isinstance(order, dict) else None
    if not _is_int(version) or version not in ACCEPTED_ORDER_VERSIONS:
        accepted = ", ".join(str(v) for v in sorted(ACCEPTED_ORDER_VERSIONS))
        raise refused(OrderRefusal.UNSUPPORTED_VERSION,
                      f"order_version {version!r}; this agent runs version {accepted} only")
    try:
        parsed = validate_order(order)
    except ValueError as error:
        raise refused(OrderRefusal.MALFORMED, str(error)) from None
    if parsed.host != host_name:
        raise refused(OrderRefusal.WRONG_HOST,
                      f"the order is for host {parsed.host[:253]!r}, this is {host_name!r}")
    if parsed.expired_at(now):
        moment = datetime.fromtimestamp(now, UTC).isoformat()
        raise refused(OrderRefusal.EXPIRED, f"received at {moment} (this host's clock), after its deadline "
                      f"{parsed.host_deadline.isoformat()} (on this host's clock)")
    window = (parsed.deadline - parsed.approved_at_time).total_seconds()
    if window > MAX_ORDER_WINDOW_SECONDS:
        raise refused(OrderRefusal.WINDOW_TOO_LONG, f"its deadline is {window:.0f} s after its approval; "
                      f"an agent accepts at most {MAX_ORDER_WINDOW_SECONDS} s")
    return cast(dict[str, Any], order)  # validate_order accepted it: a JSON object
