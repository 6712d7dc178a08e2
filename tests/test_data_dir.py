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
from gpuadmin.wire.signing import load_private_key

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


# --- private files ------------------------------------------------------------------------


def test_what_gpuadmin_writes_is_readable_by_its_own_user_only(tmp_path: Path) -> None:
    """umask 077 in every gpuadmin process: migrate writes the SQLite database (and its WAL) 0600."""
    prepare_data_dir(tmp_path)
    migrated = run_python(["manage.py", "migrate", "--verbosity", "0"], tmp_path, DATABASE_URL="",
                          REDIS_URL="")
    assert migrated.returncode == 0, migrated.stderr
    database = tmp_path / data_dir.SQLITE_DATABASE
    written = [p for p in tmp_path.iterdir() if p.name.startswith(database.name)]
    assert database in written
    assert {p.name: mode(p) for p in written} == {p.name: 0o600 for p in written}
    assert data_dir.exposure(tmp_path) == ""


def test_the_umask_is_set_by_importing_gpuadmin_whatever_the_caller_had(tmp_path: Path) -> None:
    script = "import os; os.umask(0o022); import gpuadmin; print(oct(os.umask(0)))"
    shown = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                           check=True)
    assert shown.stdout.strip() == "0o77"


def test_a_data_dir_others_can_read_is_refused_with_the_chmod_that_fixes_it(tmp_path: Path) -> None:
    prepare_data_dir(tmp_path)
    database = tmp_path / data_dir.SQLITE_DATABASE
    database.write_bytes(b"")
    database.chmod(0o644)  # as a SQLite file made before gpuadmin set its umask was
    problem = data_dir.exposure(tmp_path)
    assert f"{database} (-rw-r--r--)" in problem
    assert problem.endswith(f"Fix it with:  chmod -R go-rwx {tmp_path}")
    step = run_python(["-m", "gpuadmin.data_dir"], tmp_path)
    assert step.returncode == 1
    assert f"chmod -R go-rwx {tmp_path}" in step.stderr
    subprocess.run(["chmod", "-R", "go-rwx", str(tmp_path)], check=True)
    assert data_dir.exposure(tmp_path) == ""
    assert run_python(["-m", "gpuadmin.data_dir"], tmp_path).returncode == 0


def test_make_run_refuses_to_start_on_a_data_dir_others_can_read(tmp_path: Path) -> None:
    from tests.services import free_port

    prepare_data_dir(tmp_path)
    tmp_path.chmod(0o755)
    started = run_python(["-m", "gpuadmin.run"], tmp_path, PORT=str(free_port()), DATABASE_URL="",
                         REDIS_URL="")
    assert started.returncode == 2
    assert f"gpuadmin: other users can read the data directory: {tmp_path} (drwxr-xr-x)" in started.stderr
    assert f"chmod -R go-rwx {tmp_path}" in started.stderr
    assert not (tmp_path / data_dir.SQLITE_DATABASE).exists()  # stopped before migrating


def test_group_bits_are_allowed_for_a_deployment_that_gives_the_directory_a_group(tmp_path: Path) -> None:
    prepare_data_dir(tmp_path)
    tmp_path.chmod(0o750)  # deploy/*.service: StateDirectoryMode=0750
    assert data_dir.exposure(tmp_path) == ""


def test_collectstatic_writes_private_files_so_the_next_start_is_not_refused(tmp_path: Path) -> None:
    """The web unit's ExecStartPre, twice: the data dir step, collectstatic (hashed and compressed,
    as in production), then the step again at the next start, which refused 0644 static files."""
    assert run_python(["-m", "gpuadmin.data_dir"], tmp_path).returncode == 0
    collected = run_python(["manage.py", "collectstatic", "--noinput", "--verbosity", "0"], tmp_path,
                           GPUADMIN_STATIC_HASHED="1", DATABASE_URL="", REDIS_URL="")
    assert collected.returncode == 0, collected.stderr
    written = [p for p in (tmp_path / data_dir.STATIC_ROOT).rglob("*")]
    assert any(p.name == "staticfiles.json" for p in written)  # the manifest, written by Django's storage
    assert {oct(mode(p)) for p in written if p.is_file()} == {oct(data_dir.FILE_MODE)}
    assert {oct(mode(p)) for p in written if p.is_dir()} == {oct(data_dir.DIRECTORY_MODE)}
    again = run_python(["-m", "gpuadmin.data_dir"], tmp_path)
    assert again.returncode == 0, again.stderr


def test_the_step_makes_static_files_an_older_version_wrote_private(tmp_path: Path) -> None:
    """An upgraded install's static/ holds 0644 files from before: ours, rewritten at each start,
    so the step fixes them instead of refusing the start; anything else exposed is still refused."""
    prepare_data_dir(tmp_path)
    old = tmp_path / data_dir.STATIC_ROOT / "css" / "gpuadmin.css"
    old.parent.mkdir(mode=0o755)
    old.write_text("body {}")
    old.chmod(0o644)
    assert data_dir.exposure(tmp_path) != ""
    assert run_python(["-m", "gpuadmin.data_dir"], tmp_path).returncode == 0
    assert (mode(old.parent), mode(old)) == (0o700, 0o640)  # others' bits off; group bits are allowed
    database = tmp_path / data_dir.SQLITE_DATABASE
    database.write_bytes(b"")
    database.chmod(0o644)
    assert run_python(["-m", "gpuadmin.data_dir"], tmp_path).returncode == 1
