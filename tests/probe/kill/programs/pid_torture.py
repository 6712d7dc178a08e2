"""PID reuse torture for the kill executor; prints one JSON summary line.

usage: pid_torture.py WORKDIR ROUNDS [--pid-max N]

Meant to run as PID 1 of a fresh PID namespace (`unshare --pid --fork
--mount-proc`), where --pid-max lowers this namespace's pid_max so that PIDs
wrap every few dozen forks. Meanwhile a storm process forks short-lived
children without pause, cycling through every free PID.

Each round records the identity (PID + start time + uid + command line) of
two children, as central copies it from a snapshot: one stays alive and is an
approved target; the other exits and is reaped, and an impostor is made to
take over its PID (ns_last_pid when writable, else forking until one lands
on it). Then one order names both identities. Every signal the executor sends
is checked against the approved identities at the moment it is sent, and
each impostor reports any catchable signal it receives through a pipe.
Outside a namespace (not root) the same runs with the storm alone, and PID
reuse is left to chance.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from gpuadmin.probe import procfs  # noqa: E402
from gpuadmin.probe.journal import Journal  # noqa: E402
from gpuadmin.probe.kill import execute_order  # noqa: E402
from tests.probe.kill.helpers import make_order, pid_of_pidfd, target_for  # noqa: E402

PLAN = [{"signal": "SIGTERM", "grace_seconds": 0.5}, {"signal": "SIGKILL", "grace_seconds": 0.5}]
LAND_ATTEMPTS = 400
NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def storm(stop_r: int) -> None:
    """Fork and reap short-lived children until the pipe closes; the count goes to a file."""
    count = 0
    while not select.select([stop_r], [], [], 0)[0]:
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        count += 1
    Path(os.environ["TORTURE_COUNT_FILE"]).write_text(str(count))
    os._exit(0)


def sleeper(report_w: int | None) -> int:
    """A child that waits to be signalled; an impostor writes each catchable signal it gets to the pipe."""
    child = os.fork()
    if child:
        return child
    if report_w is not None:
        def told(signum: int, _frame: object) -> None:
            os.write(report_w, f"{os.getpid()} {signal.Signals(signum).name}\n".encode())

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, told)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)


def impostor_on(pid: int, report_w: int, can_steer: bool, attempts: int) -> int | None:
    """A new process holding ``pid``, or None when none landed on it."""
    for _ in range(attempts):
        if can_steer:
            with contextlib.suppress(OSError), open(NS_LAST_PID, "w") as steer:
                steer.write(str(pid - 1))
        child = sleeper(report_w)
        if child == pid:
            return child
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    return None


def main() -> None:
    workdir = Path(sys.argv[1])
    rounds = int(sys.argv[2])
    if "--pid-max" in sys.argv:
        Path("/proc/sys/kernel/pid_max").write_text(sys.argv[sys.argv.index("--pid-max") + 1])
    can_steer = os.access(NS_LAST_PID, os.W_OK)
    # Forking until one lands on a PID is only worth it where PIDs wrap within a few hundred forks.
    wraps_soon = can_steer or int(Path("/proc/sys/kernel/pid_max").read_text()) <= 1024
    os.environ["TORTURE_COUNT_FILE"] = str(workdir / "storm-count")
    stop_r, stop_w = os.pipe()
    storm_pid = os.fork()
    if storm_pid == 0:
        os.close(stop_w)
        storm(stop_r)
    os.close(stop_r)
    report_r, report_w = os.pipe()
    os.set_blocking(report_r, False)

    approved: set[tuple[int, int]] = set()
    violations: list[str] = []
    sent: list[tuple[int, str]] = []
    real_send = signal.pidfd_send_signal
    real_kill = os.kill

    def check(pid: int, signum: int) -> None:
        stat = procfs.read_stat(pid)
        identity = (pid, stat.start_time_ticks if stat else -1)
        sent.append((pid, signal.Signals(signum).name))
        if identity not in approved:
            name = signal.Signals(signum).name
            violations.append(f"{name} to PID {pid} (start {identity[1]}), not approved")

    def spied_send(pidfd: int, signum: int, *rest: object) -> None:
        check(pid_of_pidfd(pidfd), signum)
        real_send(pidfd, signum, *rest)

    def spied_kill(pid: int, signum: int) -> None:
        if pid not in (storm_pid,):
            check(pid, signum)
        real_kill(pid, signum)

    journal = Journal(workdir / "journal")
    reused = approved_gone = orders = 0
    results: dict[str, int] = {}
    for _ in range(rounds):
        live = sleeper(None)
        doomed = sleeper(None)
        live_target, doomed_target = target_for(live), target_for(doomed)
        # A recorded process lived at least a clock tick (central saw it in a snapshot, a person
        # approved); an impostor started in the very tick the target started, by the same uid with
        # the same command line, would be the same identity: start times count ticks (10 ms).
        time.sleep(2 / procfs.CLOCK_TICKS_PER_SECOND)
        os.kill(doomed, signal.SIGKILL)
        os.waitpid(doomed, 0)
        impostor = impostor_on(doomed, report_w, can_steer, LAND_ATTEMPTS if wraps_soon else 3)
        reused += impostor is not None
        approved.add((live, live_target["start_time_ticks"]))
        order = make_order([live_target, doomed_target], plan=PLAN)
        signal.pidfd_send_signal, os.kill = spied_send, spied_kill  # type: ignore[assignment]
        try:
            finished = execute_order(order, journal=journal, report=lambda _event: None)
        finally:
            signal.pidfd_send_signal, os.kill = real_send, real_kill  # type: ignore[assignment]
        orders += 1
        results[finished["result"]] = results.get(finished["result"], 0) + 1
        approved_gone += os.waitpid(live, os.WNOHANG)[0] == live or procfs.read_stat(live) is None
        if impostor is not None:
            os.kill(impostor, signal.SIGKILL)
            os.waitpid(impostor, 0)
        approved.discard((live, live_target["start_time_ticks"]))
        with contextlib.suppress(ChildProcessError):
            os.waitpid(live, 0)
    os.close(stop_w)
    os.waitpid(storm_pid, 0)
    with contextlib.suppress(BlockingIOError):
        impostor_reports = os.read(report_r, 65536).decode().split("\n")
        violations.extend(f"impostor got {line}" for line in impostor_reports if line)
    storm_forks = int((workdir / "storm-count").read_text())
    print(json.dumps({
        "rounds": rounds, "orders": orders, "results": results, "reused_pids": reused,
        "approved_targets_gone": approved_gone, "signals_sent": len(sent), "storm_forks": storm_forks,
        "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()), "steered": can_steer,
        "violations": violations,
    }), flush=True)


if __name__ == "__main__":
    main()
