"""The data directory (gpuadmin/data_dir.py): settings only read it; one step creates it.

Settings are loaded in a child process each time, as every gpuadmin process
loads them, with the data directory pointed somewhere new.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadmin import data_dir
from gpuadmin.data_dir import prepare_data_dir
from gpuadmin.probe.signing import load_private_key

REPO = Path(__file__).resolve().parent.parent
# What a process does first: load the settings and the Celery app (which reads them).
LOAD_SETTINGS = "import django; django.setup(); import gpuadmin.celery; from django.conf import settings; " \
    "print(settings.SECRET_KEY)"


def run_python(args: list[str], directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run Python with the data directory pointed at ``directory`` and no secret key in the environment."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("GPUADMIN_SECRET_KEY")}
    inherited.update(GPUADMIN_DATA_DIR=str(directory), DJANGO_SETTINGS_MODULE="gpuadmin.settings", **env)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=inherited, capture_output=True, text=True,
                          timeout=120, check=False)


def load_settings(directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_python(["-c", LOAD_SETTINGS], directory, **env)


def tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_loading_settings_without_a_data_dir_creates_nothing_and_names_the_command(tmp_path: Path) -> None:
    loaded = load_settings(tmp_path / "var")
    assert loaded.returncode != 0
    assert "ImproperlyConfigured: the data directory" in loaded.stderr
    assert "does not exist; create it with `python -m gpuadmin.data_dir`" in loaded.stderr
    assert tree(tmp_path) == []


def test_loading_settings_without_a_secret_key_creates_nothing_and_names_the_command(tmp_path: Path) -> None:
    loaded = load_settings(tmp_path)
    assert loaded.returncode != 0
    assert f"the data directory {tmp_path} has no secret key; create it with " \
        "`python -m gpuadmin.data_dir` (`make run` does this), or set GPUADMIN_SECRET_KEY" in loaded.stderr
    assert tree(tmp_path) == []


def test_loading_settings_with_a_key_from_the_environment_writes_nothing(tmp_path: Path) -> None:
    loaded = load_settings(tmp_path, GPUADMIN_SECRET_KEY="from-the-environment")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "from-the-environment"
    assert tree(tmp_path) == []


def test_the_step_creates_a_private_directory_and_key_that_settings_then_read(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "var"
    old_umask = os.umask(0)  # a permissive umask must not leak into the modes
    try:
        created = prepare_data_dir(directory)
    finally:
        os.umask(old_umask)

    key_file = directory / data_dir.KEY_FILE
    signing_key_file = directory / data_dir.CENTRAL_SIGNING_KEY
    assert created[0] == directory and created[-2:] == [key_file, signing_key_file]
    assert mode(directory) == 0o700
    assert mode(key_file) == 0o600
    assert mode(signing_key_file) == 0o600
    load_private_key(signing_key_file)  # an Ed25519 key
    for name in data_dir.FOLDERS:
        assert mode(directory / name) == 0o700, name
    # no temporary file left
    assert tree(directory) == sorted([data_dir.KEY_FILE, data_dir.CENTRAL_SIGNING_KEY, *data_dir.FOLDERS])
    key = key_file.read_text()
    assert len(key) >= 50
    loaded = load_settings(directory)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == key


def test_the_step_again_changes_nothing_and_keeps_the_key(tmp_path: Path) -> None:
    prepare_data_dir(tmp_path / "var")
    key = (tmp_path / "var" / data_dir.KEY_FILE).read_text()
    signing_key = (tmp_path / "var" / data_dir.CENTRAL_SIGNING_KEY).read_bytes()
    assert prepare_data_dir(tmp_path / "var") == []
    assert (tmp_path / "var" / data_dir.KEY_FILE).read_text() == key
    assert (tmp_path / "var" / data_dir.CENTRAL_SIGNING_KEY).read_bytes() == signing_key


def test_the_step_writes_no_signing_key_when_the_environment_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUADMIN_SIGNING_KEY_FILE", str(tmp_path / "elsewhere"))
    prepare_data_dir(tmp_path / "var")
    assert not (tmp_path / "var" / data_dir.CENTRAL_SIGNING_KEY).exists()
    assert data_dir.central_signing_key_path(tmp_path / "var") == tmp_path / "elsewhere"


def test_the_step_writes_no_key_file_when_the_environment_gives_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUADMIN_SECRET_KEY", "from-the-environment")
    prepare_data_dir(tmp_path / "var")
    assert not (tmp_path / "var" / data_dir.KEY_FILE).exists()


def test_the_documented_command_prepares_the_directory_named_by_the_environment(tmp_path: Path) -> None:
    directory = tmp_path / "var"
    done = run_python(["-m", "gpuadmin.data_dir"], directory)
    assert done.returncode == 0, done.stderr
    assert f"created {directory / data_dir.KEY_FILE}" in done.stdout
    assert f"gpuadmin data directory {directory} is ready" in done.stdout
    assert load_settings(directory).returncode == 0
