"""PID reuse torture: orders name recorded identities while PIDs are recycled all around them.

tests/probe/kill/programs/pid_torture.py runs the executor as PID 1 of its own
PID namespace with pid_max lowered to 400 (PIDs wrap every hundred forks), a
storm process forking short-lived children throughout, and in every round an
order for one live approved process and one whose PID an impostor took over.
Zero signals may reach anything but the approved identities. Without the
privileges for a PID namespace (not root), the same program runs here with
the storm alone and reuse left to chance, and must still send nothing astray.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.environment import without_coverage
from tests.probe.kill.helpers import PROGRAMS

ROUNDS = 150
PID_MAX = 400


def namespace_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return []
    prefix = [unshare, "--pid", "--fork", "--mount-proc"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    return prefix if probe.returncode == 0 else []


def test_recycled_pids_never_receive_a_signal_meant_for_a_recorded_identity(tmp_path: Path) -> None:
    prefix = namespace_prefix()
    argv = [*prefix, sys.executable, str(PROGRAMS / "pid_torture.py"), str(tmp_path), str(ROUNDS)]
    if prefix:
        argv += ["--pid-max", str(PID_MAX)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=without_coverage(),
                          check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])

    assert summary["violations"] == []
    assert summary["orders"] == ROUNDS
    # Every live approved target got its SIGTERM and is gone; nothing else was signalled.
    assert summary["approved_targets_gone"] == ROUNDS
    assert summary["signals_sent"] == ROUNDS
    assert summary["results"] == {"succeeded": ROUNDS}
    assert summary["storm_forks"] > 0
    if prefix:
        assert summary["pid_max"] == PID_MAX
        assert summary["storm_forks"] > PID_MAX  # PIDs wrapped (beyond the reused ones steered onto)
        assert summary["reused_pids"] >= ROUNDS * 9 // 10  # nearly every order named a taken-over PID
