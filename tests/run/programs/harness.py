"""Runs a command as a child subreaper and reports what the command left behind.

    python tests/run/programs/harness.py COMMAND...

Prints `HARNESS pid <pid>` when the command has started; after it exits,
`HARNESS exit <status>` and `HARNESS leftovers <json>`: every process that was
re-parented to this harness (anything the command orphaned and did not reap,
zombies included), which the harness then kills and reaps itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
SETTLE_SECONDS = 0.5


def my_children() -> list[dict]:
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read().decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me:
            found.append({"pid": int(entry), "state": fields[0], "pgid": int(fields[2]),
                          "sid": int(fields[3]), "comm": comm})
    return found


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"HARNESS cannot become a subreaper: {os.strerror(ctypes.get_errno())}", flush=True)
        return 2
    # Our own signals go to the command: the test signals the command directly.
    command = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    print(f"HARNESS pid {command.pid}", flush=True)
    status = command.wait()
    time.sleep(SETTLE_SECONDS)  # let anything the command orphaned on its way out arrive here
    leftovers = my_children()
    print(f"HARNESS exit {status}", flush=True)
    print(f"HARNESS leftovers {json.dumps(leftovers)}", flush=True)
    for process in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process["pid"], signal.SIGKILL)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
