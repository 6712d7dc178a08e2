"""The supervisor of `make run` (gpuadmin.run.Supervisor) with small real children.

Each test runs the supervisor in its own process under tests/run/harness.py, a
child subreaper: whatever the supervisor orphans or leaves unreaped lands
there and is reported as a leftover.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap

from tests.run.supervised import SupervisedRun, in_groups_or_sessions, zombies_of

SUPERVISOR = textwrap.dedent("""
    import json, os, sys
    from gpuadmin.run import Child, Supervisor, become_subreaper
    become_subreaper()
    children = [Child(name, argv) for name, argv in json.loads(sys.argv[1])]
    supervisor = Supervisor(children, dict(os.environ), out=lambda line: print(line, flush=True),
                            stop_grace_seconds=1.0)
    sys.exit(supervisor.run())
""")

# Ignores SIGTERM, has a grandchild that ignores it too, and leaves one zombie
# it never reaps: only SIGKILL to the whole group ends it, and the zombie must
# then be reaped by the supervisor.
STUBBORN = textwrap.dedent("""
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    zombie = os.fork()
    if zombie == 0:
        os._exit(0)
    # Ready once it has exited (a slow exit, e.g. under coverage, would race the test's
    # look); WNOWAIT leaves it unreaped, a zombie.
    os.waitid(os.P_PID, zombie, os.WEXITED | os.WNOWAIT)
    print("stubborn ready", flush=True)
    time.sleep(600)
""")

SLEEPER = "import time; print('sleeper ready', flush=True); time.sleep(600)"

# Starts a grandchild in its own group, then dies: the grandchild is orphaned.
DIES_LEAVING_AN_ORPHAN = textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    print("parent ready", flush=True)
    time.sleep(0.5)
    os._exit(3)
""")


def supervise(children: list[tuple[str, str]]) -> SupervisedRun:
    spec = json.dumps([[name, [sys.executable, "-c", code]] for name, code in children])
    return SupervisedRun([sys.executable, "-c", SUPERVISOR, spec], env=dict(os.environ)).start()


def test_ctrl_c_stops_every_group_escalating_to_sigkill_and_reaps_everything() -> None:
    run = supervise([("stubborn", STUBBORN), ("sleeper", SLEEPER)])
    children: dict[str, int] = {}
    try:
        run.wait_for_line("stubborn ready", 30)
        run.wait_for_line("sleeper ready", 30)
        children = run.started_children()
        groups = set(children.values())
        # The stubborn leader, its sleeping grandchild and its zombie; the sleeper.
        before = in_groups_or_sessions(groups)
        assert len(before) >= 4, before
        assert any(p.state == "Z" for p in before), before

        os.kill(run.command_pid, signal.SIGINT)
        status, leftovers = run.finish(timeout_seconds=30)

        assert status == 0, run.output
        assert "stubborn did not stop in time; sending SIGKILL" in run.output
        assert "sleeper did not stop" not in run.output
        assert leftovers == [], run.output
        assert in_groups_or_sessions(groups) == []
        assert zombies_of(groups | {run.command_pid}) == []
    finally:
        run.kill_everything(set(children.values()))


def test_a_child_that_dies_stops_the_others_and_exits_non_zero() -> None:
    run = supervise([("sleeper", SLEEPER), ("short-lived", DIES_LEAVING_AN_ORPHAN)])
    children: dict[str, int] = {}
    try:
        run.wait_for_line("parent ready", 30)
        children = run.started_children()
        status, leftovers = run.finish(timeout_seconds=30)

        assert status == 1, run.output
        assert "gpuadmin: short-lived exited with status 3 unexpectedly; stopping the rest" in run.output
        # The orphaned grandchild was stopped and reaped along with the sleeper.
        assert leftovers == [], run.output
        assert in_groups_or_sessions(set(children.values())) == []
    finally:
        run.kill_everything(set(children.values()))


def test_sigterm_stops_as_ctrl_c_does() -> None:
    run = supervise([("sleeper", SLEEPER)])
    children: dict[str, int] = {}
    try:
        run.wait_for_line("sleeper ready", 30)
        children = run.started_children()
        os.kill(run.command_pid, signal.SIGTERM)
        status, leftovers = run.finish(timeout_seconds=30)

        assert status == 0, run.output
        assert "gpuadmin: SIGTERM received; stopping sleeper" in run.output
        assert leftovers == []
        assert in_groups_or_sessions(set(children.values())) == []
    finally:
        run.kill_everything(set(children.values()))
