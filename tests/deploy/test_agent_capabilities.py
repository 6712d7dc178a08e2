"""The agent unit's three capabilities are enough, and each one is needed.

The unit runs the agent as an unprivileged user with exactly the capabilities
in its AmbientCapabilities=. This test does the same without systemd:
`setpriv` starts the real probe (a copy of gpuadmin/probe and the wire contract
it imports, gpuadmin/wire: `--json` needs only the standard library) as an
unprivileged uid with those capabilities, against a real process of another
uid that holds a "device" file. With all three the probe names the holder and
a pidfd signal reaches it; without any one of them it cannot. Needs root (to switch uids), as CI has.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import services

REPO = Path(__file__).resolve().parents[2]
AGENT_UNIT = REPO / "deploy" / "gpuadmin-agent.service"
# Uids no account uses: the holder's and the agent's.
HOLDER_UID = 23456
AGENT_UID = 23457
SIGNAL_BY_PIDFD = (
    "import os, signal, sys; "
    "fd = os.pidfd_open(int(sys.argv[1])); signal.pidfd_send_signal(fd, signal.SIGTERM)"
)


def _needs(condition: bool, reason: str) -> None:
    if condition:
        return
    if services.services_required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def unit_capabilities() -> list[str]:
    for line in AGENT_UNIT.read_text().splitlines():
        if line.startswith("AmbientCapabilities="):
            return line.split("=", 1)[1].split()
    raise AssertionError("the agent unit has no AmbientCapabilities=")


def as_user(uid: int, capabilities: list[str]) -> list[str]:
    """setpriv arguments for uid with exactly these capabilities, as the unit's settings give them."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    if capabilities:
        names = ",".join("+" + c.removeprefix("CAP_").lower() for c in capabilities)
        argv += [f"--inh-caps={names}", f"--ambient-caps={names}", f"--bounding-set=-all,{names}"]
    else:
        argv += ["--inh-caps=-all", "--bounding-set=-all"]
    return argv


@pytest.fixture(scope="module")
def python_for_others() -> str:
    """A Python 3.11+ that an unprivileged uid may run (the virtualenv's may live under /root)."""
    _needs(os.geteuid() == 0, "switching to other uids needs root")
    _needs(shutil.which("setpriv") is not None, "setpriv is not installed (Debian: util-linux)")
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        check = subprocess.run(
            [*as_user(AGENT_UID, []), candidate, "-c", "import sys; assert sys.version_info >= (3, 11)"],
            capture_output=True, timeout=60, check=False,
        )
        if check.returncode == 0:
            return candidate
    _needs(False, "no Python 3.11+ here that an unprivileged user may run")
    raise AssertionError("unreachable")


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpuadmin-agent-caps-"))  # pytest's tmp_path is 0700
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def probe_code(world_readable_dir: Path) -> Path:
    code = world_readable_dir / "code"
    (code / "gpuadmin").mkdir(parents=True)
    shutil.copy(REPO / "gpuadmin" / "__init__.py", code / "gpuadmin")
    for package in ("probe", "wire"):
        shutil.copytree(REPO / "gpuadmin" / package, code / "gpuadmin" / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for path in code.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    code.chmod(0o755)
    return code


@pytest.fixture
def device_file(world_readable_dir: Path) -> Path:
    devices = world_readable_dir / "dev"
    devices.mkdir()
    devices.chmod(0o755)  # not mkdir(mode=...): gpuadmin sets umask 077 in this process too
    device = devices / "nvidia-test0"
    device.write_text("")
    device.chmod(0o644)
    return device


@contextlib.contextmanager
def holder_of(device: Path, python: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process of another uid that keeps ``device`` open until told to stop."""
    holder = subprocess.Popen(
        [*as_user(HOLDER_UID, []), python, "-c",
         "import sys; f = open(sys.argv[1]); print('ready', flush=True); sys.stdin.read()", str(device)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)


def holders_seen(capabilities: list[str], python: str, code: Path, device: Path) -> dict[int, list[str]]:
    result = subprocess.run(
        [*as_user(AGENT_UID, capabilities), python, "-m", "gpuadmin.probe", "--json",
         "--gpu-backend", "none", "--device-glob", str(device.parent / "nvidia*")],
        cwd=code, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    return {p["pid"]: p["device_files"] for p in json.loads(result.stdout)["processes"] if p["device_files"]}


def test_the_unit_grants_kill_ptrace_and_dac_read_search() -> None:
    assert sorted(unit_capabilities()) == ["CAP_DAC_READ_SEARCH", "CAP_KILL", "CAP_SYS_PTRACE"]


def test_with_the_units_capabilities_the_probe_finds_another_users_device_holder(
    python_for_others: str, probe_code: Path, device_file: Path
) -> None:
    with holder_of(device_file, python_for_others) as holder:
        seen = holders_seen(unit_capabilities(), python_for_others, probe_code, device_file)
        assert seen.get(holder.pid) == [str(device_file)]


@pytest.mark.parametrize("left_out", ["CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"])
def test_without_either_read_capability_the_holder_is_invisible(
    python_for_others: str, probe_code: Path, device_file: Path, left_out: str
) -> None:
    fewer = [c for c in unit_capabilities() if c != left_out]
    with holder_of(device_file, python_for_others) as holder:
        assert holder.pid not in holders_seen(fewer, python_for_others, probe_code, device_file)


def test_a_pidfd_signal_reaches_another_users_process_only_with_cap_kill(
    python_for_others: str, device_file: Path
) -> None:
    with holder_of(device_file, python_for_others) as holder:
        without_kill = [c for c in unit_capabilities() if c != "CAP_KILL"]
        refused = subprocess.run(
            [*as_user(AGENT_UID, without_kill), python_for_others, "-c", SIGNAL_BY_PIDFD, str(holder.pid)],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert refused.returncode != 0 and "PermissionError" in refused.stderr
        assert holder.poll() is None

        all_three = unit_capabilities()
        sent = subprocess.run(
            [*as_user(AGENT_UID, all_three), python_for_others, "-c", SIGNAL_BY_PIDFD, str(holder.pid)],
            capture_output=True, text=True, timeout=60, check=False,
        )
        assert sent.returncode == 0, sent.stderr
        assert holder.wait(timeout=30) == -signal.SIGTERM
