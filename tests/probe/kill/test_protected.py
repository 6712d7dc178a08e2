"""The agent's protected executables (probe/kill/protected.py): by the executable it resolves, not argv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.probe.kill.protected import DEFAULT_PROTECTED_EXECUTABLES, ProtectedExecutables, parse_patterns
from tests.probe.kill.helpers import Reports, make_order, target_for, wait_until


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    children: list[subprocess.Popen] = []
    yield children
    for child in children:
        child.kill()
        child.wait()


def test_a_daemon_s_executable_is_never_signalled_whatever_its_argv(
    tmp_path: Path, journal: Journal, started: list[subprocess.Popen]
) -> None:
    daemon_binary = tmp_path / "redis-server"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", daemon_binary)
    daemon = subprocess.Popen([str(daemon_binary), "600"])  # argv[0] could say anything
    started.append(daemon)
    wait_until(lambda: Path(f"/proc/{daemon.pid}/exe").resolve() == daemon_binary, what="the daemon's exec")
    reports = Reports()

    result = execute_order(make_order([target_for(daemon.pid)]), journal=journal, report=reports)

    assert result["result"] == "refused" and daemon.poll() is None
    refused = next(e for e in reports if e["event"] == "refused")
    assert refused["reason"] == "protected_executable" and str(daemon_binary) in refused["detail"]


def test_a_job_calling_itself_sshd_is_not_protected_by_its_argv(
    journal: Journal, started: list[subprocess.Popen]
) -> None:
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "sshd:", "/usr/sbin/sshd"])
    started.append(job)
    # Approve the process as it is after exec: before it, the identity is the forked test runner's.
    wait_until(lambda: b"sshd:" in Path(f"/proc/{job.pid}/cmdline").read_bytes(), what="the job's exec")

    result = execute_order(make_order([target_for(job.pid)]), journal=journal, report=Reports())

    assert result["result"] == "succeeded"
    job.wait(timeout=10)


def test_the_host_s_list_takes_json_or_lines_and_commas_inside_patterns() -> None:
    assert parse_patterns('["(^|/)a{1,3}$", "b"]') == ("(^|/)a{1,3}$", "b")
    assert parse_patterns("(^|/)a{1,3}$\n\n  b  \n") == ("(^|/)a{1,3}$", "b")
    assert parse_patterns("@default\n/opt/lab/bin/keeper$") == (*DEFAULT_PROTECTED_EXECUTABLES,
                                                                  "/opt/lab/bin/keeper$")
    with pytest.raises(ValueError, match="JSON"):
        parse_patterns("[not json")
    assert ProtectedExecutables.from_env({}).patterns == DEFAULT_PROTECTED_EXECUTABLES
    assert ProtectedExecutables.from_env({"GPUADMIN_AGENT_PROTECTED_EXECUTABLES": "x$"}).patterns == ("x$",)


@pytest.mark.parametrize("path", ["/usr/sbin/sshd", "/usr/lib/systemd/systemd-journald", "/sbin/init",
                                  "/usr/bin/containerd-shim-runc-v2", "/usr/bin/dockerd", "/usr/bin/kubelet",
                                  "/usr/bin/nvidia-persistenced", "/usr/bin/nv-fabricmanager",
                                  "/usr/bin/nv-hostengine", "/usr/bin/redis-server",
                                  "/usr/lib/postgresql/16/bin/postgres"])
def test_the_defaults_cover_the_system_daemons(path: str) -> None:
    import re

    assert any(re.search(pattern, path) for pattern in DEFAULT_PROTECTED_EXECUTABLES)
    assert not any(re.search(pattern, "/home/alice/bin/python-sshd-tool") for pattern in
                   DEFAULT_PROTECTED_EXECUTABLES)
