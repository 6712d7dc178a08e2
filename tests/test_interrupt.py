"""A test run ended by SIGTERM tears its fixtures down (tests/interrupt.py), with xdist's workers too:
the process a fixture started in a session of its own does not outlive the run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CHILD_TEST = """
import os, subprocess, time
from pathlib import Path

import pytest


@pytest.fixture
def server():
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(os.environ["SERVER_PID_FILE"]).write_text(str(process.pid))
    yield process
    process.kill()
    process.wait()


def test_runs_until_stopped(server):
    time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["alone", "xdist"])
def test_a_run_stopped_by_sigterm_stops_what_its_fixtures_started(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    pid_file = tmp_path / "server.pid"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SERVER_PID_FILE": str(pid_file)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.interrupt",
            *workers, "test_child.py"]
    run = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    server = 0
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert run.poll() is None, run.communicate()[0].decode(errors="replace")
            time.sleep(0.1)
        server = int(pid_file.read_text())
        assert alive(server)
        os.killpg(run.pid, signal.SIGTERM)  # as timeout(1) does: the run's whole process group
        output = run.communicate(timeout=60)[0].decode(errors="replace")
        assert not alive(server), output
        assert "KeyboardInterrupt" in output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        if server and alive(server):
            os.kill(server, signal.SIGKILL)
