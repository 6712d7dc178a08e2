"""A process whose main thread exits while another thread runs on: alive, yet /proc shows it "Z".

usage: leader_exits.py WORKDIR [now | on-sigint]

Its leader calls pthread_exit: /proc/<pid>/stat then shows state "Z" and an
empty command line, though the process keeps running in its other thread
(and would keep its GPU memory). It ignores SIGTERM, and SIGINT once its leader
has exited (Python runs signal handlers in the main thread only), so only
SIGKILL ends it.

"now" (the default): the leader exits at once; WORKDIR/ready appears once it
has. "on-sigint": it runs as usual (ready at once) until a SIGINT, which it
logs to WORKDIR/signals.log and answers by exiting its leader — a user
dodging a kill that way. It leaves when WORKDIR/stop appears or after two
minutes, so a failed test leaks nothing.
"""

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

LIFETIME_SECONDS = 120


def leader_has_exited() -> bool:
    # /proc/self, read from any thread, is the process's entry: the leader's state.
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def say_ready(workdir: Path) -> None:
    (workdir / "ready.tmp").write_text(str(os.getpid()))
    os.replace(workdir / "ready.tmp", workdir / "ready")


def wait_for_stop(workdir: Path, deadline: float) -> None:
    while time.monotonic() < deadline and not (workdir / "stop").exists():
        time.sleep(0.05)


def live_on(workdir: Path, *, say_ready_then: bool) -> None:
    """The thread that outlives the leader."""
    deadline = time.monotonic() + LIFETIME_SECONDS
    while not leader_has_exited() and time.monotonic() < deadline:
        time.sleep(0.01)
    if say_ready_then:
        say_ready(workdir)
    wait_for_stop(workdir, deadline)
    os._exit(0)


def exit_leader(workdir: Path, *, say_ready_then: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=live_on, args=(workdir,), kwargs={"say_ready_then": say_ready_then}).start()
    ctypes.CDLL(None).pthread_exit(None)  # ctypes lets go of the GIL first


def main() -> None:
    workdir = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "now"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "now":
        exit_leader(workdir, say_ready_then=True)

    def on_sigint(_signum: int, _frame: object) -> None:
        with open(workdir / "signals.log", "a") as log:
            log.write("SIGINT\n")
        exit_leader(workdir, say_ready_then=False)

    signal.signal(signal.SIGINT, on_sigint)
    say_ready(workdir)
    wait_for_stop(workdir, time.monotonic() + LIFETIME_SECONDS)


if __name__ == "__main__":
    main()
