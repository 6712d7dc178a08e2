"""A stand-in training job for the kill tests.

usage: trainer.py WORKDIR [SIGNAL=ACTION ...]   ACTION: checkpoint | exit | ignore | exec (default exit)

It logs every SIGINT/SIGTERM it receives to WORKDIR/signals.log, so a test can
say exactly which signals reached it. "checkpoint" writes WORKDIR/checkpoint.pt
the way a trainer saves its state on Ctrl+C, then exits. It says it is ready
(handlers installed) by creating WORKDIR/ready, and leaves on its own when
WORKDIR/stop appears or after two minutes, so a failed test leaks nothing.
"exec" replaces the program by another (this script, told to ignore both
signals) in the same process: same PID and start time, new command line.
"""

import os
import signal
import sys
import time
from pathlib import Path

LIFETIME_SECONDS = 120


def main() -> None:
    workdir = Path(sys.argv[1])
    actions = dict(argument.split("=", 1) for argument in sys.argv[2:])

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        with open(workdir / "signals.log", "a") as log:
            log.write(name + "\n")
        action = actions.get(name, "exit")
        if action == "checkpoint":
            temporary = workdir / "checkpoint.pt.tmp"
            temporary.write_text(f"step=1234 saved on {name}\n")
            os.replace(temporary, workdir / "checkpoint.pt")
            os._exit(0)
        if action == "exec":
            arguments = [str(workdir), "SIGINT=ignore", "SIGTERM=ignore", "execed=yes"]
            os.execv(sys.executable, [sys.executable, __file__, *arguments])
        if action == "exit":
            os._exit(128 + signum)

    for name in ("SIGINT", "SIGTERM"):
        signal.signal(signal.Signals[name], on_signal)
    (workdir / "ready.tmp").write_text(str(os.getpid()))
    os.replace(workdir / "ready.tmp", workdir / "ready")
    deadline = time.monotonic() + LIFETIME_SECONDS
    while time.monotonic() < deadline and not (workdir / "stop").exists():
        time.sleep(0.05)


if __name__ == "__main__":
    main()
