"""The supervisor of `make run` (gpuadmin.run.Supervisor) with small real children.

Each test runs the supervisor in its own process under tests/run/programs/harness.py, a
child subreaper: whatever the supervisor orphans or leaves unreaped lands
there and is reported as a leftover.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

from gpuadmin.data_dir import read_supervisor_state
from tests.run.helpers import SupervisedRun, in_groups_or_sessions, process_table, zombies_of

SUPERVISOR = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from gpuadmin.data_dir import supervisor_state_path
    from gpuadmin.run import Child, Supervisor, become_subreaper
    become_subreaper()
    children = [Child(name, argv) for name, argv in json.loads(sys.argv[1])]
    supervisor = Supervisor(children, dict(os.environ), out=lambda line: print(line, flush=True),
                            stop_grace_seconds=1.0, restart_backoff_first_seconds=0.05,
                            state_path=supervisor_state_path(Path(sys.argv[2])))
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
    # Wait until it has exited without reaping it (WNOWAIT): a zombie before "ready", however busy the box.
    os.waitid(os.P_PID, zombie, os.WEXITED | os.WNOWAIT)
    print("stubborn ready", flush=True)
    time.sleep(600)
""")

SLEEPER = "import time; print('sleeper ready', flush=True); time.sleep(600)"

# First life: starts a grandchild in its process group, then dies (the grandchild
# is orphaned). Second life, once the marker file exists: just runs.
DIES_ONCE_LEAVING_AN_ORPHAN = textwrap.dedent("""
    import os, sys, time
    marker = sys.argv[1]
    if os.path.exists(marker):
        print("second life ready", flush=True)
        time.sleep(600)
    open(marker, "w").close()
    orphan = os.fork()
    if orphan == 0:
        time.sleep(600)
        os._exit(0)
    print(f"first life left orphan {orphan}", flush=True)
    os._exit(3)
""")

ALWAYS_DIES = "import sys; sys.exit(3)"


def supervise(children: list[tuple[str, str]], tmp_path: Path, *args: str) -> SupervisedRun:
    spec = json.dumps([[name, [sys.executable, "-c", code, *args]] for name, code in children])
    argv = [sys.executable, "-c", SUPERVISOR, spec, str(tmp_path)]
    return SupervisedRun(argv, env=dict(os.environ)).start()


def started_lines(run: SupervisedRun, name: str) -> list[str]:
    return [line for line in run.lines if line.startswith(f"gpuadmin: started {name} (pid ")]


def test_ctrl_c_stops_every_group_escalating_to_sigkill_and_reaps_everything(tmp_path: Path) -> None:
    run = supervise([("stubborn", STUBBORN), ("sleeper", SLEEPER)], tmp_path)
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


def test_a_child_that_died_is_restarted_after_what_it_left_is_stopped_and_ctrl_c_still_ends_all(
    tmp_path: Path,
) -> None:
    run = supervise([("sleeper", SLEEPER), ("dies-once", DIES_ONCE_LEAVING_AN_ORPHAN)], tmp_path,
                    str(tmp_path / "marker"))
    groups: set[int] = set()
    try:
        orphan = int(run.wait_for_line(r"first life left orphan (\d+)", 30).group(1))
        run.wait_for_line("second life ready", 30)
        run.wait_for_line("sleeper ready", 30)
        groups = {int(line.split("pid ")[1].rstrip(")")) for line in run.lines
                  if line.startswith("gpuadmin: started ")}

        assert ("gpuadmin: dies-once exited with status 3 unexpectedly; restarting it in 0.05 s "
                "(restart 1 of 5 allowed within 5 minutes)") in run.lines, run.output
        assert len(started_lines(run, "dies-once")) == 2
        assert len(started_lines(run, "sleeper")) == 1  # the other child was left alone
        assert orphan not in {p.pid for p in process_table()}  # stopped and reaped before the restart
        state = read_supervisor_state(tmp_path)
        assert state is not None and state.restarts == 1 and state.pid == run.command_pid

        os.kill(run.command_pid, signal.SIGINT)
        status, leftovers = run.finish(timeout_seconds=30)

        assert status == 0, run.output
        assert leftovers == [], run.output
        assert in_groups_or_sessions(groups) == []
        assert read_supervisor_state(tmp_path) is None  # nothing published once stopped
    finally:
        run.kill_everything(groups)


def test_a_child_that_keeps_dying_is_given_up_on_after_five_restarts_and_everything_stops(
    tmp_path: Path,
) -> None:
    run = supervise([("sleeper", SLEEPER), ("crasher", ALWAYS_DIES)], tmp_path)
    groups: set[int] = set()
    try:
        status, leftovers = run.finish(timeout_seconds=60)
        groups = {int(line.split("pid ")[1].rstrip(")")) for line in run.lines
                  if line.startswith("gpuadmin: started ")}

        assert status == 1, run.output
        assert len(started_lines(run, "crasher")) == 6, run.output  # the first start and 5 restarts
        assert "(restart 5 of 5 allowed within 5 minutes)" in run.output
        assert ("gpuadmin: crasher exited with status 3 unexpectedly, after 5 restarts within 5 minutes; "
                "giving up and stopping everything") in run.lines, run.output
        assert leftovers == [], run.output
        assert in_groups_or_sessions(groups) == []  # the sleeper was stopped too
    finally:
        run.kill_everything(groups)


def test_sigterm_stops_as_ctrl_c_does(tmp_path: Path) -> None:
    run = supervise([("sleeper", SLEEPER)], tmp_path)
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
