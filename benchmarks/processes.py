"""The processes a benchmark starts: each in its own process group, and none outlives the benchmark.

Every script here that starts a process calls ``guard()`` first and starts
its children with ``spawn()`` (or through ``tests/services.py``, whose
servers lead their own groups too). ``guard()`` makes the script:

- a child subreaper (``gpuadmin.run.become_subreaper``, as `make run`'s
  supervisor is): a grandchild whose parent dies comes back to the script,
  not to PID 1, so it can still be found and stopped;
- turn SIGTERM, like SIGINT, into an exception in the main thread, so that
  the script's ``finally`` blocks and context managers run on every way out;
- stop at exit (atexit) every group it spawned, then every child it still
  has (the re-parented ones included): SIGTERM, a grace period, SIGKILL,
  and reap them all.

Children in their own group do not see the terminal's Ctrl+C; the script
stops them, in its own order.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from gpuadmin.run import become_subreaper

GRACE_SECONDS = 10.0
KILL_WAIT_SECONDS = 5.0
POLL_SECONDS = 0.05

_spawned: list[subprocess.Popen[Any]] = []
_guarded: list[bool] = []  # holds True once guard() ran


def guard() -> None:
    """Make this script stop everything it started on every exit path; idempotent."""
    if _guarded:
        return
    _guarded.append(True)
    become_subreaper()
    signal.signal(signal.SIGINT, _raise_on_signal)
    signal.signal(signal.SIGTERM, _raise_on_signal)
    atexit.register(stop_all)


def _raise_on_signal(signum: int, _frame: object) -> None:
    # A second signal while the first one's cleanup runs must not cut that cleanup short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    script = os.path.basename(sys.argv[0])
    print(f"{script}: {signal.Signals(signum).name} received; stopping what it started", file=sys.stderr,
          flush=True)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def spawn(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen in a new session (its own process group), stopped with the group at exit."""
    process = subprocess.Popen(list(argv), start_new_session=True, **popen_kwargs)
    _spawned.append(process)
    return process


def stop(process: subprocess.Popen[Any], *, first_signal: int = signal.SIGTERM,
         grace_seconds: float = GRACE_SECONDS) -> int | None:
    """``first_signal`` to the group's leader, SIGKILL to whatever of its group is left after the grace.

    The leader first: gunicorn, Celery and `make run`'s supervisor stop their
    own children in order. Returns the leader's exit status.
    """
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, first_signal)
            os.killpg(process.pid, signal.SIGCONT)  # a stopped group (SIGSTOP) hears it once continued
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_seconds)
    if _group_alive(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        _wait(lambda: not _group_alive(process.pid), min(grace_seconds, KILL_WAIT_SECONDS))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_WAIT_SECONDS)
    return process.returncode


def signal_groups(spawned: Sequence[subprocess.Popen[Any]], signum: int) -> None:
    """``signum`` to each spawned process's group: a worker's main process and its pool."""
    for process in spawned:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)


def stop_all(grace_seconds: float = GRACE_SECONDS) -> None:
    """Stop every group spawned, then every child this process still has; reap them all."""
    for process in reversed(_spawned):
        stop(process, grace_seconds=grace_seconds)
    _spawned.clear()
    # What is left: children started otherwise, and orphans re-parented to us (subreaper).
    # Each SIGKILL can orphan more, so go round until none is left.
    signalled: set[int] = set()
    deadline = time.monotonic() + grace_seconds + KILL_WAIT_SECONDS
    while True:
        _reap()
        # Zombies count: one that died after _reap must still be reaped here, not left to the
        # process that adopts it when this script exits.
        left = children_of(os.getpid(), zombies=True)
        if not left:
            return
        late = time.monotonic() > deadline - KILL_WAIT_SECONDS
        for pid in left:
            signum = signal.SIGKILL if late or pid in signalled else signal.SIGTERM
            signalled.add(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid and pid != os.getpgrp():
                    os.killpg(pid, signum)
                os.kill(pid, signum)
        if time.monotonic() > deadline:
            print(f"{os.path.basename(sys.argv[0])}: processes {left} survived SIGKILL (state D?)",
                  file=sys.stderr)
            return
        time.sleep(0.5 if not late else POLL_SECONDS)


def children_of(parent: int, *, zombies: bool = False) -> list[int]:
    """Processes whose parent is ``parent``, from /proc: live ones, and zombies if asked."""
    return sorted(pid for pid, fields in _stat_fields()
                  if int(fields[1]) == parent and (zombies or fields[0] != b"Z"))


def session_members(sid: int) -> list[int]:
    """Every process in session ``sid``, from /proc."""
    return sorted(pid for pid, fields in _stat_fields() if int(fields[3]) == sid)


def _stat_fields() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, session, ...)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                yield int(entry), stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _wait(done: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        _reap()
        time.sleep(POLL_SECONDS)
