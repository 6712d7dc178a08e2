"""Execute one approved kill order on this host: verify, signal, escalate, report.

The sequence (docs/kill-order.md has the why):

1. validate the order (ValueError: nothing journaled, nothing reported);
2. claim the request id in the journal — a repeat delivery answers from the
   journal instead and executes nothing;
3. refuse the whole order when its start deadline has passed ("expired");
4. per target: refuse the protected (PID 1, kernel threads, the agent and its
   ancestors), open a pidfd, verify the identity from /proc while holding it,
   refuse zombies and changed identities;
5. for each plan step: re-verify and signal every target still alive through
   its pidfd, then wait up to the step's grace for them to exit (pidfds become
   readable when their process exits); stop as soon as none is left;
6. report what survived the last step, and the result.

Every event is written to the journal (fsync'ed) before it is reported, so a
crash leaves a record that says how far the order got.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuadmin.probe import procfs
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.kill.identity import Observation, Seen, describe_parent, observe, protected_pids
from gpuadmin.probe.kill.protected import ProtectedExecutables
from gpuadmin.wire.kill_order import Order, PlanStep, Target, validate_order
from gpuadmin.wire.kill_protocol import (
    Action,
    Event,
    Method,
    OrderRefusal,
    Outcome,
    Refusal,
    Result,
    event_record,
    finished_event,
    order_refused_event,
)
from gpuadmin.wire.timestamps import wire_time

if TYPE_CHECKING:
    from gpuadmin.probe.journal import Journal, JournalEntry, JournalWriter

logger = logging.getLogger(__name__)

# Without pidfds nothing wakes us when a process exits: look at /proc this often.
FALLBACK_POLL_SECONDS = 0.02


Report = Callable[[dict[str, Any]], None]


@dataclass(slots=True)
class _Tracked:
    """One target during execution."""

    target: Target
    pidfd: int | None = None
    method: Method = Method.PIDFD
    outcome: Outcome | None = None  # None while it may still be alive
    signals_sent: list[str] = field(default_factory=list)
    last_sent_monotonic: float = 0.0
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "pid": self.target.pid,
            "start_time_ticks": self.target.start_time_ticks,
            "user": self.target.user,
            "name": self.target.name,
            "outcome": self.outcome.value if self.outcome else None,
            "signals_sent": list(self.signals_sent),
            "method": self.method.value,
            "detail": self.detail,
            **self.extra,
        }

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def order_sha256(order: dict[str, Any]) -> str:
    """Digest of the order as delivered, to notice a different order under a known request id."""
    canonical = json.dumps(order, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _pidfd_is_readable(pidfd: int) -> bool:
    """A pidfd polls readable once its whole process has exited (zombie or reaped).

    Not while only the leader has exited and other threads still run, though
    /proc then shows state "Z": the process lives on, with its GPU memory.
    """
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class _Execution:
    def __init__(self, order: Order, raw_sha256: str, *, report: Report, clock: Callable[[], float],
                 protected_executables: ProtectedExecutables) -> None:
        self.order = order
        self.raw_sha256 = raw_sha256
        self._report = report
        self.clock = clock
        self.writer: JournalWriter | None = None
        self.seq = 0
        self.tracked = [_Tracked(target) for target in order.targets]
        self.host_boot_id = procfs.read_boot_id()
        self.protected_executables = protected_executables

    # -- events ------------------------------------------------------------

    def emit(self, event: Event, tracked: _Tracked | None = None, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        if tracked is not None:
            fields = {"pid": tracked.target.pid, "start_time_ticks": tracked.target.start_time_ticks,
                      "method": tracked.method, **fields}
        record = event_record(self.order.request_id, seq=self.seq, at=wire_time(self.clock()), event=event,
                              **fields)
        return self.record(record)

    def record(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.writer is not None:
            self.writer.append(record)  # journal first: a crash after this line is still on record
        deliver(self._report, record)
        return record

    def refuse(self, tracked: _Tracked, reason: Refusal, detail: str, **fields: Any) -> None:
        # The agent declining to touch a target is a refusal; a target it could
        # not signal (EPERM...), or that changed after it got a signal, is a
        # failure of the order: it is still there and nobody decided so.
        could_not = reason in (Refusal.PERMISSION_DENIED, Refusal.SIGNAL_ERROR)
        tracked.outcome = Outcome.FAILED if could_not or tracked.signals_sent else Outcome.REFUSED
        tracked.detail = f"refused: {detail}"
        tracked.extra.update({"reason": reason.value, **fields})
        self.emit(Event.REFUSED, tracked, reason=reason.value, detail=tracked.detail, **fields)
        tracked.close()

    def exited(self, tracked: _Tracked) -> None:
        """Report a target whose process is gone or a zombie; it holds no GPU memory any more."""
        stat = procfs.read_stat(tracked.target.pid)
        last = tracked.signals_sent[-1] if tracked.signals_sent else None
        if last is None:
            when = "before any signal"
        else:
            elapsed = time.monotonic() - tracked.last_sent_monotonic
            when = f"after {last}, {elapsed:.2f} s after it was sent"
        fields: dict[str, Any] = {}
        same_process = stat is not None and stat.start_time_ticks == tracked.target.start_time_ticks
        if stat is not None and same_process and stat.zombie:
            tracked.detail = f"exited, not yet reaped by parent {describe_parent(stat.ppid)} ({when})"
            fields["parent_pid"] = stat.ppid
        else:
            tracked.detail = f"exited ({when})"
        tracked.outcome = Outcome.EXITED
        tracked.extra.update(fields)
        self.emit(Event.TARGET_EXITED, tracked, signal=last, detail=tracked.detail, **fields)
        tracked.close()

    # -- the run -----------------------------------------------------------

    def preflight(self) -> None:
        """Open a pidfd per target and verify it; refuse what must not be touched."""
        protected = protected_pids()
        for tracked in self.tracked:
            pid = tracked.target.pid
            if pid in protected:
                reason, detail = protected[pid]
                self.refuse(tracked, reason, detail)
                continue
            try:
                tracked.pidfd = os.pidfd_open(pid)
            except AttributeError:
                tracked.method = Method.KILL
            except ProcessLookupError:
                self.exited(tracked)
                continue
            except OSError as error:
                if error.errno != errno.ENOSYS:
                    self.refuse_unopenable(tracked, error)
                    continue
                tracked.method = Method.KILL
            seen = self.observe(tracked)
            if seen.seen is Seen.ALIVE:
                continue
            if seen.seen is Seen.GONE:
                self.exited(tracked)
            elif seen.seen is Seen.ZOMBIE and seen.stat is not None:
                self.refuse(
                    tracked,
                    Refusal.ZOMBIE,
                    f"already exited, a zombie waiting for parent {describe_parent(seen.stat.ppid)} "
                    "to reap it; only the parent can reap it (or its death hands the zombie to init)",
                    parent_pid=seen.stat.ppid,
                )
            else:
                self.refuse(tracked, seen.refusal or Refusal.IDENTITY_CHANGED, seen.detail)

    def refuse_unopenable(self, tracked: _Tracked, error: OSError) -> None:
        """pidfd_open failed on a PID that exists: never fall back to kill() for it."""
        # A thread id is the usual cause (EINVAL, or ENOENT on newer kernels):
        # observe() recognises it and names the process it belongs to.
        seen = self.observe(tracked)
        if seen.seen is Seen.GONE:
            self.exited(tracked)
        elif seen.refusal is not None and seen.seen is not Seen.ALIVE:
            self.refuse(tracked, seen.refusal, seen.detail)
        else:
            code = errno.errorcode.get(error.errno or 0, str(error.errno))
            detail = f"could not open a pidfd: {error.strerror}"
            self.refuse(tracked, Refusal.SIGNAL_ERROR, detail, error=code)

    def observe(self, tracked: _Tracked) -> Observation:
        return observe(tracked.target, order_boot_id=self.order.boot_id, host_boot_id=self.host_boot_id,
                       protected_executables=self.protected_executables,
                       allowed_uids=self.order.self_service_uids)

    def verified_alive(self, tracked: _Tracked, step: PlanStep) -> Observation | None:
        """Re-verify a target before a signal; None (and the event written) when it must not get it."""
        if tracked.pidfd is not None and _pidfd_is_readable(tracked.pidfd):
            self.exited(tracked)
            return None
        seen = self.observe(tracked)
        if seen.seen is Seen.ALIVE:
            return seen
        # Gone, a zombie, or its PID already serves another: it exited, if its pidfd agrees.
        if seen.seen in (Seen.GONE, Seen.ZOMBIE, Seen.REUSED) and self.has_exited(tracked):
            self.exited(tracked)
        else:
            detail = seen.detail or f"/proc shows it {seen.seen.value}, yet its pidfd says it has not exited"
            self.refuse(tracked, seen.refusal or Refusal.IDENTITY_CHANGED, f"before {step.signal}: {detail}")
        return None

    @staticmethod
    def has_exited(tracked: _Tracked) -> bool:
        """Whether /proc's word that the target exited holds: its pidfd decides, where one is held.

        Polled after /proc was read, it cannot lag behind it; and it never says
        so of a process whose leader exited while its other threads run.
        """
        return tracked.pidfd is None or _pidfd_is_readable(tracked.pidfd)

    def send(self, tracked: _Tracked, step: PlanStep, step_number: int) -> None:
        """Re-verify one target and send it the step's signal."""
        seen = self.verified_alive(tracked, step)
        if seen is None:
            return
        try:
            if tracked.pidfd is not None:
                signal.pidfd_send_signal(tracked.pidfd, step.signum)
            else:
                os.kill(tracked.target.pid, step.signum)
        except ProcessLookupError:
            self.exited(tracked)
            return
        except PermissionError:
            self.refuse(
                tracked,
                Refusal.PERMISSION_DENIED,
                f"could not send {step.signal}: permission denied (EPERM); the agent's user may not signal "
                "this process",
                error="EPERM",
            )
            return
        except OSError as error:
            code = errno.errorcode.get(error.errno or 0, str(error.errno))
            self.refuse(
                tracked, Refusal.SIGNAL_ERROR, f"could not send {step.signal}: {error.strerror}", error=code
            )
            return
        tracked.signals_sent.append(step.signal)
        tracked.last_sent_monotonic = time.monotonic()
        detail = (
            f"sent {step.signal} (step {step_number} of {len(self.order.plan)}; "
            f"grace {step.grace_seconds:g} s)"
        )
        if tracked.method is Method.KILL:
            detail += "; via kill(), pidfds unavailable"
        if seen.stat is not None and procfs.process_state(seen.stat) == "D":
            detail += "; it is in uninterruptible sleep (D): the signal waits until its kernel call returns"
        self.emit(Event.SIGNAL_SENT, tracked, signal=step.signal, step=step_number, detail=detail)

    def alive(self) -> list[_Tracked]:
        return [tracked for tracked in self.tracked if tracked.outcome is None]

    def wait(self, grace_seconds: float) -> None:
        """Wait up to the grace for the live targets to exit, noticing each exit at once."""
        deadline = time.monotonic() + grace_seconds
        while alive := self.alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            by_fd = {tracked.pidfd: tracked for tracked in alive if tracked.pidfd is not None}
            watched_by_proc = [tracked for tracked in alive if tracked.pidfd is None]
            timeout = min(remaining, FALLBACK_POLL_SECONDS) if watched_by_proc else remaining
            poller = select.poll()
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            for fd, _mask in poller.poll(math.ceil(timeout * 1000)):
                self.exited(by_fd[fd])
            for tracked in watched_by_proc:
                if self.observe(tracked).seen in (Seen.GONE, Seen.ZOMBIE, Seen.REUSED):
                    self.exited(tracked)

    def survived(self, tracked: _Tracked) -> None:
        last_step = self.order.plan[-1]
        stat = procfs.read_stat(tracked.target.pid)
        state = procfs.process_state(stat) if stat is not None else None
        detail = f"still alive {last_step.grace_seconds:g} s after {last_step.signal}, the last step"
        if state == "D":
            detail += (
                "; in uninterruptible sleep (state D): no signal acts until its kernel call returns "
                "(often a stuck driver or file system)"
            )
        elif state == "T":
            detail += "; stopped (state T): catchable signals wait until it is continued"
        elif state:
            detail += f"; state {state}"
        tracked.outcome = Outcome.SURVIVED
        tracked.detail = detail
        tracked.extra["state"] = state
        self.emit(Event.TARGET_SURVIVED, tracked, signal=last_step.signal, state=state, detail=detail)
        tracked.close()

    def ask_to_reap(self) -> None:
        """A reap plan: one SIGCHLD to each target, a pause for it to act, and nothing more, ever."""
        step = self.order.plan[0]
        for tracked in self.alive():
            self.send(tracked, step, 1)
        self.wait(step.grace_seconds)
        for tracked in self.alive():
            tracked.outcome = Outcome.ASKED
            tracked.detail = (
                f"asked to reap its children with {step.signal}; still running, as meant "
                "(the next snapshot shows whether its zombies are gone)"
            )
            tracked.close()

    def escalate(self) -> None:
        if self.order.asks_to_reap:
            self.ask_to_reap()
            return
        for step_number, step in enumerate(self.order.plan, start=1):
            for tracked in self.alive():
                self.send(tracked, step, step_number)
            if not self.alive():
                return
            self.wait(step.grace_seconds)
        for tracked in self.alive():
            self.survived(tracked)

    def result(self) -> tuple[Result, str]:
        outcomes = [tracked.outcome for tracked in self.tracked]
        total = len(outcomes)
        counts = {outcome: outcomes.count(outcome) for outcome in Outcome}
        tally = ", ".join(f"{count} {outcome.value}" for outcome, count in counts.items() if count)
        if survived := counts[Outcome.SURVIVED]:
            return Result.UNKILLABLE, f"{survived} of {total} targets still alive after the plan ({tally})"
        if failed := counts[Outcome.FAILED]:
            return Result.FAILED, f"{failed} of {total} targets could not be signalled ({tally})"
        if counts[Outcome.REFUSED] == total:
            return Result.REFUSED, f"all {total} targets refused; nothing was signalled"
        if asked := counts[Outcome.ASKED]:
            return Result.SUCCEEDED, f"asked {asked} of {total} targets to reap their children ({tally})"
        return Result.SUCCEEDED, f"every target not refused is gone ({tally})"

    def finish(self, result: Result, detail: str, **extra: Any) -> dict[str, Any]:
        self.seq += 1
        return self.record(finished_event(
            self.order.request_id, seq=self.seq, at=wire_time(self.clock()), result=result, detail=detail,
            targets=[tracked.summary() for tracked in self.tracked], **extra,
        ))

    def close(self) -> None:
        for tracked in self.tracked:
            tracked.close()


def deliver(report: Report, event: dict[str, Any]) -> None:
    """Hand an event to the caller; a failing report must not stop an escalation half-way."""
    try:
        report(dict(event))
    except Exception:
        # The journal holds the event; central learns the outcome from "finished"
        # or from a redelivery answered out of the journal.
        logger.exception("could not report kill event %s #%s", event.get("event"), event.get("seq"))


def _answer_repeat(
    order: Order, raw_sha256: str, journal: Journal, report: Report, clock: Callable[[], float]
) -> dict[str, Any] | None:
    """A delivery of a request id the journal already holds: execute nothing."""
    writer = journal.wait_for(order.request_id)  # waits while another delivery still runs it
    if writer is None:
        return None  # pruned in the meantime: the caller claims afresh
    with writer:
        entry = writer.entry
        if entry.claim.get("order_sha256") not in (None, raw_sha256):
            # Another order under a request id already executed: refused, and
            # never answered with the recorded result as if it were the same order.
            refusal = order_refused_event(
                order.request_id, at=wire_time(clock()), reason=OrderRefusal.CONFLICT,
                detail="this delivery's content differs from the order recorded under this request id "
                f"(claimed at {entry.claim.get('claimed_at', '?')}); nothing executed",
                order_sha256=raw_sha256,
            )
            deliver(report, refusal)
            return refusal
        recorded = entry.finished
        if recorded is not None:
            answer = dict(recorded, duplicate=True, answered_at=wire_time(clock()))
            answer["detail"] = f"{recorded.get('detail', '')}; repeat delivery, nothing executed"
            deliver(report, answer)
            return answer
        answer = finished_event(
            order.request_id,
            seq=entry.last_seq + 1,
            at=wire_time(clock()),
            result=Result.INTERRUPTED,
            detail=(
                f"an earlier delivery claimed this order at {entry.claim.get('claimed_at', '?')} and never "
                f"finished (the agent stopped mid-way); nothing executed now"
            ),
            targets=_summary_from_journal(order, entry),
            duplicate=True,
        )
        writer.append(answer)  # later deliveries answer "interrupted" as a recorded result
        deliver(report, answer)
        return answer


def _summary_from_journal(order: Order, entry: JournalEntry) -> list[dict[str, Any]]:
    """Per target, what the interrupted delivery had recorded before it stopped."""
    outcome_of_event = {
        Event.TARGET_EXITED: Outcome.EXITED.value,
        Event.TARGET_SURVIVED: Outcome.SURVIVED.value,
        Event.REFUSED: Outcome.REFUSED.value,
    }
    # One JSON object per target, as finished_event sends it (values of several types).
    summaries: dict[int, dict[str, Any]] = {
        target.pid: {
            "pid": target.pid,
            "start_time_ticks": target.start_time_ticks,
            "user": target.user,
            "name": target.name,
            "outcome": None,
            "signals_sent": [],
            "method": None,
            "detail": "unknown: the delivery stopped before recording an outcome",
        }
        for target in order.targets
    }
    for event in entry.events:
        summary = summaries.get(event.get("pid"))  # type: ignore[arg-type]
        if summary is None:
            continue
        if event.get("event") == Event.SIGNAL_SENT:
            summary["signals_sent"].append(event.get("signal"))
            summary["method"] = event.get("method")
        elif event.get("event") in outcome_of_event:
            summary["outcome"] = outcome_of_event[event["event"]]
            summary["detail"] = event.get("detail", "")
    return list(summaries.values())


def execute_order(
    order: dict[str, Any],
    *,
    journal: Journal,
    report: Report,
    clock: Callable[[], float] = time.time,
    protected_executables: ProtectedExecutables | None = None,
    probe_config: ProbeConfig | None = None,
) -> dict[str, Any]:
    """Execute an approved kill order on this host; returns the "finished" event.

    ``protected_executables`` (default: from GPUADMIN_AGENT_PROTECTED_EXECUTABLES) is checked
    on each target's executable before every signal. ``probe_config`` (default: from the
    GPUADMIN_* variables) names the GPU backend a reset order checks and resets with.

    Raises ValueError for a malformed order (before anything is journaled or
    reported). ``report`` receives every event as it happens; an exception it
    raises is logged and the execution goes on.
    """
    parsed = validate_order(order)
    raw_sha256 = order_sha256(order)
    execution = _Execution(parsed, raw_sha256, report=report, clock=clock,
                           protected_executables=protected_executables if protected_executables is not None
                           else ProtectedExecutables.from_env())
    claim_record = {
        "request_id": parsed.request_id,
        "claimed_at": wire_time(clock()),
        "order_sha256": raw_sha256,
        "agent_pid": os.getpid(),
        "order": order,
    }
    for _attempt in range(3):
        writer = journal.claim(parsed.request_id, claim_record)
        if writer is not None:
            break
        answer = _answer_repeat(parsed, raw_sha256, journal, report, clock)
        if answer is not None:
            return answer
    else:
        raise RuntimeError(f"could not claim or read the journal entry of request {parsed.request_id}")
    with writer:
        execution.writer = writer
        try:
            now = clock()
            if parsed.expired_at(now):
                for tracked in execution.tracked:
                    tracked.detail = "not executed: the order expired"
                deadline = wire_time(parsed.host_deadline.timestamp())
                return execution.finish(
                    Result.EXPIRED,
                    f"received at {wire_time(now)}, after its start deadline {deadline} (both on this host's "
                    "clock); nothing was done",
                )
            if parsed.action is Action.RESET_GPU:
                from gpuadmin.probe.kill.reset import reset_gpu

                execution.emit(Event.STARTED, detail=f"checking GPU {parsed.gpu_uuid} for a reset, "
                               f"approved by {parsed.approved_by}")
                outcome = reset_gpu(parsed.gpu_uuid, probe_config or ProbeConfig.from_env())
                return execution.finish(outcome.result, outcome.detail, **outcome.fields)
            approval = (f"self-service by {parsed.self_service_person}, only uids "
                        f"{', '.join(str(u) for u in sorted(parsed.self_service_uids))}"
                        if parsed.self_service_uids is not None else f"approved by {parsed.approved_by}")
            execution.emit(
                Event.STARTED,
                detail=f"executing {parsed.describe_plan()} on {len(parsed.targets)} target(s), {approval}",
            )
            execution.preflight()
            execution.escalate()
            result, detail = execution.result()
            return execution.finish(result, detail)
        finally:
            execution.close()
