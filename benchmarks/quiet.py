"""Waiting for a quiet machine before measuring (shared by the benchmarks).

A test run on the same 2 CPUs would distort every figure, so a benchmark
waits for other pytest processes to end (10 s polls, 10 minutes at most),
then measures anyway with a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

QUIET_POLL_SECONDS = 10
QUIET_WAIT_MAX_SECONDS = 600


def _own_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def wait_until_no_pytest() -> None:
    mine = _own_ancestors()
    deadline = time.monotonic() + QUIET_WAIT_MAX_SECONDS
    while True:
        found = subprocess.run(["pgrep", "-f", "pytest"], capture_output=True, text=True, check=False)
        others = [int(p) for p in found.stdout.split() if int(p) not in mine]
        if not others:
            return
        if time.monotonic() >= deadline:
            print(f"warning: pytest still running after {QUIET_WAIT_MAX_SECONDS} s (pids {others}); "
                  "measuring anyway, figures may be disturbed", file=sys.stderr)
            return
        print(f"waiting for pytest to finish (pids {others}) ...", file=sys.stderr, flush=True)
        time.sleep(QUIET_POLL_SECONDS)
