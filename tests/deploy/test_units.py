"""deploy/*.service: every unit passes `systemd-analyze verify` with no warning.

The units name their programs under /opt/gpuadmin (docs/deploy.md). verify
checks that each ExecStart program exists and is executable, so the test
renders the units with this checkout and this virtualenv in place of
/opt/gpuadmin: a unit that names a program the install does not have (a typo,
a renamed entry point) fails here, not on a lab's first boot.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

REPO = Path(__file__).resolve().parents[2]
UNITS = sorted([*(REPO / "deploy").glob("*.service"), *(REPO / "deploy").glob("*.socket")])
INSTALL_ROOT = "/opt/gpuadmin"
# The units' programs: the install's virtualenv, here the one running the tests.
VENV_BIN = Path(sys.executable).parent


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        message = "systemd-analyze is not installed (Debian: the systemd package)"
        if services.services_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def render(unit: Path, into: Path, *, replace: tuple[str, str] | None = None) -> Path:
    text = unit.read_text()
    text = text.replace(f"{INSTALL_ROOT}/.venv/bin/", f"{VENV_BIN}/").replace(INSTALL_ROOT, str(REPO))
    if replace:
        text = text.replace(*replace)
    rendered = into / unit.name
    rendered.write_text(text)
    return rendered


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    # --man=no: the units' Documentation= is a file:// URL, not a man page.
    return subprocess.run([systemd_analyze(), "verify", "--man=no", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)


def exec_programs(unit: Path) -> list[str]:
    return [line.split("=", 1)[1].split()[0] for line in unit.read_text().splitlines()
            if line.startswith("ExecStart=")]


def test_there_is_a_unit_for_each_part() -> None:
    assert [u.name for u in UNITS] == [
        "gpuadmin-agent.service", "gpuadmin-beat.service", "gpuadmin-web.service", "gpuadmin-web.socket",
        "gpuadmin-worker.service",
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_verifies_without_a_warning(unit: Path, tmp_path: Path) -> None:
    for other in UNITS:  # beside it, as installed: the web service needs its socket unit
        render(other, tmp_path)
    rendered = render(unit, tmp_path)
    programs = exec_programs(rendered)
    if unit.suffix == ".service":  # verify's check of the programs means something
        assert programs and all(Path(p).is_file() for p in programs), programs
    result = verify(rendered)
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).strip() == ""


def test_verify_reports_a_program_the_install_does_not_have(tmp_path: Path) -> None:
    rendered = render(REPO / "deploy" / "gpuadmin-web.service", tmp_path,
                      replace=("bin/gunicorn ", "bin/gunicorn-renamed "))
    result = verify(rendered)
    assert result.returncode != 0
    assert "gunicorn-renamed" in result.stderr


def test_verify_reports_a_misspelt_setting(tmp_path: Path) -> None:
    # An unknown key is only a warning (exit status 0): the output must be read.
    rendered = render(REPO / "deploy" / "gpuadmin-agent.service", tmp_path,
                      replace=("AmbientCapabilities=", "AmbientCapabilites="))
    result = verify(rendered)
    assert "AmbientCapabilites" in result.stderr


def unit_settings(unit: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_the_agent_runs_as_its_own_user_with_three_capabilities_only() -> None:
    agent = unit_settings(REPO / "deploy" / "gpuadmin-agent.service")
    needed = {"CAP_KILL", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
    assert set(" ".join(agent["AmbientCapabilities"]).split()) == needed
    assert set(" ".join(agent["CapabilityBoundingSet"]).split()) == needed
    assert agent["User"] == ["gpuadmin-agent"]
    assert agent["NoNewPrivileges"] == ["yes"]
    # Host PIDs: no private PID namespace, every process visible in /proc.
    assert "PrivatePIDs" not in agent
    assert agent["ProtectProc"] == ["default"] and agent["ProcSubset"] == ["all"]
    # NVML opens /dev/nvidia*: no private /dev, and no device allow-list (which
    # ProtectClock= would imply) that leaves them out.
    assert agent["PrivateDevices"] == ["no"]
    assert not {"DeviceAllow", "DevicePolicy", "ProtectClock"} & set(agent)


@pytest.mark.parametrize("name", ["gpuadmin-web.service", "gpuadmin-worker.service", "gpuadmin-beat.service"])
def test_central_units_hold_no_capability(name: str) -> None:
    unit = unit_settings(REPO / "deploy" / name)
    assert unit["CapabilityBoundingSet"] == [""]
    assert "AmbientCapabilities" not in unit
    assert unit["User"] == ["gpuadmin"]


def test_the_agent_unit_starts_the_agent_s_own_entry_point_and_does_not_retry_bad_settings(
    tmp_path: Path,
) -> None:
    from gpuadmin.agent.__main__ import EXIT_CONFIGURATION

    agent = unit_settings(REPO / "deploy" / "gpuadmin-agent.service")
    [command] = agent["ExecStart"]
    argv = command.split()
    assert argv[:3] == [f"{INSTALL_ROOT}/.venv/bin/python", "-m", "gpuadmin.agent"]
    assert "ExecStartPre" not in agent  # the agent prepares its data directory, without central's key
    assert agent["EnvironmentFile"] == ["/etc/gpuadmin/agent.env"]
    assert agent["RestartPreventExitStatus"] == [str(EXIT_CONFIGURATION)]
    # The unit's own command with the unit's own variables but no agent.env: it refuses to start.
    environment = dict(part.split("=", 1) for line in agent["Environment"] for part in line.split())
    environment |= {"GPUADMIN_HOST_NAME": "gpu07", "GPUADMIN_DATA_DIR": str(tmp_path / "agent"),
                    "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(VENV_BIN / "python"), *argv[1:]], env=environment, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXIT_CONFIGURATION, done.stderr
    assert "missing REDIS_URL, GPUADMIN_CENTRAL_PUBLIC_KEY" in done.stderr
    example = (REPO / "deploy" / "agent.env.example").read_text()
    assert "\nGPUADMIN_CENTRAL_PUBLIC_KEY=" in example and "#GPUADMIN_CENTRAL_PUBLIC_KEY_FILE=" in example


SOCKET_PATH = "/run/gpuadmin/gunicorn.sock"


def test_gunicorn_listens_on_a_unix_socket_only_nginx_and_gpuadmin_can_open() -> None:
    """Issue 30: on 127.0.0.1:8000 any local user reached gunicorn and claimed any X-Forwarded-For
    (the login throttle's address) and X-Forwarded-Proto; the settings trust only this socket."""
    from django.conf import settings

    socket_unit = unit_settings(REPO / "deploy" / "gpuadmin-web.socket")
    assert socket_unit["ListenStream"] == [SOCKET_PATH]
    assert socket_unit["SocketMode"] == ["0660"]
    assert socket_unit["SocketUser"] == ["gpuadmin"] and socket_unit["SocketGroup"] == ["www-data"]
    web = unit_settings(REPO / "deploy" / "gpuadmin-web.service")
    assert web["Requires"] == ["gpuadmin-web.socket"]
    [command] = web["ExecStart"]
    argv = command.split()
    assert argv[argv.index("--bind") + 1] == f"unix:{SOCKET_PATH}"
    assert [a for a in argv if "127.0.0.1" in a or "0.0.0.0" in a or a.startswith(":")] == []
    nginx = (REPO / "deploy" / "nginx-gpuadmin.conf").read_text()
    assert f"server unix:{SOCKET_PATH};" in nginx and "127.0.0.1:8000" not in nginx
    assert settings.GPUADMIN_TRUSTED_PROXIES == ["unix"]  # the default, what the unit relies on


@pytest.mark.parametrize("name", ["gpuadmin-worker.service", "gpuadmin-agent.service"])
def test_a_worker_that_stops_on_its_own_is_started_again(name: str) -> None:
    """Whatever its exit status: a stop from inside exits 3 (gpuadmin/celery.py), but Restart=always
    does not depend on that. Only the agent's status 2 (its settings are wrong) is final."""
    unit = unit_settings(REPO / "deploy" / name)
    assert unit["Restart"] == ["always"]
    assert unit.get("RestartPreventExitStatus", ["2"]) == ["2"]
