"""Production settings from the environment pass `manage.py check --deploy` with no warning.

Run in a subprocess, so the settings are read from that environment exactly as
gunicorn would read them at start (settings are module-level code).
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import sys
from pathlib import Path

import dj_database_url
import pytest

REPO = Path(__file__).resolve().parents[2]


def production_environment(data_dir: Path, **overrides: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("GPUADMIN_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL")}
    environment.update({
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        "GPUADMIN_DATA_DIR": str(data_dir),
        "GPUADMIN_HTTPS": "1",
        "GPUADMIN_SECRET_KEY": secrets.token_urlsafe(50),
        "GPUADMIN_ALLOWED_HOSTS": "gpu.lab.example",
        "GPUADMIN_CSRF_TRUSTED_ORIGINS": "https://gpu.lab.example",
        "GPUADMIN_METRICS_TOKEN": secrets.token_urlsafe(32),
        "DATABASE_URL": "postgresql://gpuadmin:pw@db.lab.example/gpuadmin",  # check --deploy never connects
        "REDIS_URL": "redis://:pw@redis.lab.example:6379/0",
    })
    environment.update(overrides)
    return environment


def check_deploy(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=120, check=False,
    )


def test_production_settings_pass_check_deploy_with_no_warning(tmp_path: Path) -> None:
    result = check_deploy(production_environment(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.parametrize(("overrides", "warning"), [
    ({"GPUADMIN_HTTPS": ""}, "security.W012"),  # session cookie over plain HTTP
    ({"GPUADMIN_DEBUG": "1"}, "security.W018"),
    ({"GPUADMIN_SECRET_KEY": "short"}, "security.W009"),
])
def test_check_deploy_warns_when_a_production_setting_is_missing(
    tmp_path: Path, overrides: dict[str, str], warning: str
) -> None:
    result = check_deploy(production_environment(tmp_path, **overrides))
    assert result.returncode != 0
    assert warning in result.stdout + result.stderr


def test_the_example_central_env_passes_check_deploy_through_gpuadmin_manage(tmp_path: Path) -> None:
    """deploy/central.env.example, as docs/deploy.md installs it, read the way gpuadmin-manage reads it."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "secret_key").write_text(secrets.token_urlsafe(48) + "\n")
    (etc / "metrics_token").write_text(secrets.token_urlsafe(32) + "\n")
    env_file = etc / "central.env"
    example = (REPO / "deploy" / "central.env.example").read_text()
    env_file.write_text(example.replace("/etc/gpuadmin/", f"{etc}/"))
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("GPUADMIN_", "DJANGO_")) and k not in ("DATABASE_URL", "REDIS_URL")}
    environment.update({
        "GPUADMIN_ENV_FILE": str(env_file),
        "GPUADMIN_ROOT": str(REPO),
        "GPUADMIN_PYTHON": sys.executable,
        "GPUADMIN_MANAGE_USER": pwd.getpwuid(os.getuid()).pw_name,
        "GPUADMIN_DATA_DIR": str(tmp_path / "data"),
    })
    result = subprocess.run(
        [str(REPO / "deploy" / "gpuadmin-manage"), "check", "--deploy", "--fail-level", "WARNING"],
        env=environment, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_the_example_socket_database_url_names_the_socket_directory_and_no_password() -> None:
    """central.env.example's other DATABASE_URL, for PostgreSQL on the same machine, read as settings
    read DATABASE_URL: psycopg takes a host that is a path as the socket's directory."""
    example = (REPO / "deploy" / "central.env.example").read_text()
    (line,) = [line for line in example.splitlines() if line.startswith("#DATABASE_URL=")]
    parsed = dj_database_url.parse(line.split("=", 1)[1].strip("'"))
    assert (parsed["ENGINE"], parsed["HOST"], parsed["USER"], parsed["PASSWORD"], parsed["NAME"]) == (
        "django.db.backends.postgresql", "/var/run/postgresql", "gpuadmin", "", "gpuadmin"
    )


def test_the_example_s_replica_and_sentinel_lines_pass_check_deploy(tmp_path: Path) -> None:
    """central.env.example's commented lines for growing beyond one box (docs/deploy.md, section 11)."""
    example = (REPO / "deploy" / "central.env.example").read_text()
    names = ("GPUADMIN_DATABASE_REPLICA_URL", "REDIS_URL", "GPUADMIN_REDIS_SENTINEL_MASTER")
    lines = dict(line[1:].split("=", 1) for line in example.splitlines()
                 if line.startswith(tuple(f"#{name}=" for name in names)))
    overrides = {name: value.strip("'") for name, value in lines.items()}
    assert set(overrides) == set(names) and overrides["REDIS_URL"].startswith("sentinel://")
    result = check_deploy(production_environment(tmp_path, **overrides))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout
