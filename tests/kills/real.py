"""Real processes for the kill tests: trainers with real signal handlers, and
snapshot records that carry their real identity (start time, uid, digest, boot id)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from gpuadmin.probe import procfs
from tests.environment import without_coverage
from tests.factories import proc

# Prints "ready" once its handlers are installed, then sleeps until a signal ends it.
TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    checkpoint = sys.argv[1]
    mode = sys.argv[2]

    def save_and_exit(signum, frame):
        with open(checkpoint, "w") as f:
            f.write(f"saved on {signal.Signals(signum).name} at {time.time()!r}")
        sys.exit(0)

    if mode == "checkpoint-on-sigint":
        signal.signal(signal.SIGINT, save_and_exit)
    elif mode == "ignore-sigint":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, save_and_exit)
    elif mode == "ignore-both":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        time.sleep(3600)
    """
)


def start_trainer(directory: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    checkpoint = directory / f"checkpoint-{mode}.txt"
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(checkpoint), mode], stdout=subprocess.PIPE, text=True,
        env=without_coverage(),
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child, checkpoint


def real_record(pid: int, **extra: Any) -> dict[str, Any]:
    """A snapshot process record with the live process's real identity."""
    stat = procfs.read_stat(pid)
    raw = procfs.read_cmdline_bytes(pid)
    assert stat is not None and raw is not None, f"PID {pid} is gone"
    argv = [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]
    record = proc(
        pid, ppid=stat.ppid, state=stat.state, start=stat.start_time_ticks, uid=os.getuid(),
        user="root" if os.getuid() == 0 else str(os.getuid()), name=stat.comm, cmdline=argv, **extra,
    )
    record["cmdline_sha256"] = procfs.cmdline_sha256(raw)
    return record
