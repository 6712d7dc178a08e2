"""A parent that lets its child die and does not reap it: a real zombie.

usage: zombie_parent.py WORKDIR [SIGCHLD=reap]

Writes the zombie's PID to WORKDIR/zombie, logs signals it gets to
WORKDIR/signals.log (and otherwise ignores them), and reaps the zombie and
leaves when WORKDIR/stop appears (PID 1 on some hosts never reaps orphans).
With SIGCHLD=reap it reaps its zombie when a SIGCHLD arrives (as a parent that
handles SIGCHLD but missed one would), and logs that SIGCHLD came.
"""

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

LIFETIME_SECONDS = 120


def main() -> None:
    workdir = Path(sys.argv[1])

    def on_signal(signum: int, _frame: object) -> None:
        with open(workdir / "signals.log", "a") as log:
            log.write(signal.Signals(signum).name + "\n")

    for name in ("SIGINT", "SIGTERM"):
        signal.signal(signal.Signals[name], on_signal)
    child = os.fork()
    if child == 0:
        os._exit(0)
    while True:  # wait until the child is really a zombie
        with open(f"/proc/{child}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    if "SIGCHLD=reap" in sys.argv[2:]:
        # Installed only now: the SIGCHLD of the child's own exit has come and gone unhandled.
        def reap(signum: int, _frame: object) -> None:
            on_signal(signum, _frame)
            os.waitpid(child, os.WNOHANG)

        signal.signal(signal.SIGCHLD, reap)
    (workdir / "zombie").write_text(str(child))
    (workdir / "ready").write_text(str(os.getpid()))
    deadline = time.monotonic() + LIFETIME_SECONDS
    while time.monotonic() < deadline and not (workdir / "stop").exists():
        time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):  # reaped on SIGCHLD already
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
