"""A job tree like a launcher with workers: parent, children, grandchildren, and a child in its own session.

usage: tree.py WORKDIR reaper

    reaper (child subreaper; not a target: stands in for init and reaps orphans)
    └── parent                      exits on SIGINT
        ├── child ── grandchild     children ignore SIGINT, exit on SIGTERM
        ├── child ── grandchild     grandchildren ignore SIGINT and SIGTERM
        └── child (setsid) ── grandchild

Every member writes WORKDIR/pids/<role>-<pid> once its handlers are set, and
leaves when WORKDIR/stop appears or after two minutes. The reaper exists
because PID 1 on some hosts never reaps orphans; with it, the orphans of a
killed parent are re-parented to it and reaped, as on a host with a working init.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LIFETIME_SECONDS = 120
PR_SET_CHILD_SUBREAPER = 36
IGNORED = {
    "parent": (),
    "child": ("SIGINT",),
    "grandchild": ("SIGINT", "SIGTERM"),
}


def spawn(workdir: Path, role: str, *, own_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, str(workdir), role], start_new_session=own_session)


def wait_for_stop(workdir: Path) -> None:
    deadline = time.monotonic() + LIFETIME_SECONDS
    while time.monotonic() < deadline and not (workdir / "stop").exists():
        time.sleep(0.05)


def reaper(workdir: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    spawn(workdir, "parent")
    deadline = time.monotonic() + LIFETIME_SECONDS
    while time.monotonic() < deadline and not (workdir / "stop").exists():
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.02)
    try:
        while True:  # the test's clean-up killed what was left: reap it all
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass


def member(workdir: Path, role: str) -> None:
    def on_signal(signum: int, _frame: object) -> None:
        if signal.Signals(signum).name not in IGNORED[role]:
            os._exit(128 + signum)

    for name in ("SIGINT", "SIGTERM"):
        signal.signal(signal.Signals[name], on_signal)
    if role == "parent":
        spawn(workdir, "child")
        spawn(workdir, "child")
        spawn(workdir, "child", own_session=True)
    elif role == "child":
        spawn(workdir, "grandchild")
    marker = workdir / "pids" / f"{role}-{os.getpid()}"
    marker.with_suffix(".tmp").write_text("")
    os.replace(marker.with_suffix(".tmp"), marker)
    wait_for_stop(workdir)


def main() -> None:
    workdir, role = Path(sys.argv[1]), sys.argv[2]
    (workdir / "pids").mkdir(exist_ok=True)
    if role == "reaper":
        reaper(workdir)
    else:
        member(workdir, role)


if __name__ == "__main__":
    main()
