"""The data directory (GPUADMIN_DATA_DIR, default ``var/``): what lives in it, and the step that creates it.

Importing the settings only reads: it finds the directory and its secret key,
and stops with an error naming ``python -m gpuadmin.data_dir`` when they are
missing. That command (``make run`` runs it first, through
``gpuadmin.run``) creates the directory (0700), the secret key (0600) unless
GPUADMIN_SECRET_KEY gives one, and the folders the embedded broker and static
files need, and central's Ed25519 signing key (0600) unless
GPUADMIN_SIGNING_KEY_FILE names one. Running it again changes nothing.

An agent's own key (``agent_signing_key``) is made by the agent on its first
start (``gpuadmin.agent.identity``), in its own data directory.

It also refuses a data directory that other users can read (``exposure``):
the database holds session keys and the directory the secret key.
Everything gpuadmin writes is private anyway (``gpuadmin.PRIVATE_UMASK``);
this catches what was made before, or by hand.

No Django here: it runs before the settings can load.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuadmin.env import env_secret, env_str
from gpuadmin.wire.files import write_file

BASE_DIR = Path(__file__).resolve().parent.parent
PREPARE_COMMAND = "python -m gpuadmin.data_dir"
KEY_VARIABLE = "GPUADMIN_SECRET_KEY"
SIGNING_KEY_FILE_VARIABLE = "GPUADMIN_SIGNING_KEY_FILE"

# What lives in the directory, relative to it (settings build their paths from these).
KEY_FILE = "secret_key"
SQLITE_DATABASE = "gpuadmin.sqlite3"
STATIC_ROOT = "static"
BEAT_SCHEDULE_FILE = "celerybeat-schedule"
AGENT_JOURNAL = "agent-journal"
# What an agent's last full snapshot was, for its updates (gpuadmin/agent/snapshot_choice.py).
AGENT_SNAPSHOT_STATE = "agent-snapshot-state.json"
# Written by `make run` when GPUADMIN_GPU_BACKEND=simulated names no file (gpuadmin/run.py).
DEMO_SIMULATED_GPUS = "simulated-gpus.json"
# Central's Ed25519 key, which signs every kill order (docs/security.md).
CENTRAL_SIGNING_KEY = "central_signing_key"
# Central's signed heads of the audit chain, one JSON line each (gpuadmin/audit/anchors.py), unless
# GPUADMIN_AUDIT_ANCHOR_FILE names another file (in production: one the database's writers cannot edit).
AUDIT_ANCHORS = "audit-anchors.jsonl"
# An agent's Ed25519 key, which signs its snapshots and kill reports.
AGENT_SIGNING_KEY = "agent_signing_key"
# The master key of `manage.py demo_fleet`'s synthetic hosts (gpuadmin/fleet/synthetic.py), made on first use.
DEMO_FLEET_KEY = "demo_fleet_key"
# `make run`'s supervisor publishes its restart counts here (gpuadmin/run.py); /healthz and the
# pages' footer read them (read_supervisor_state).
SUPERVISOR_STATE = "supervisor.json"
# The embedded broker's folder (used when REDIS_URL is not set); gpuadmin/broker/filesystem.py
# makes its own subfolders in it (docs/broker.md).
BROKER = "broker"
# Each is made 0700 (mkdir's parents would get the umask's mode).
FOLDERS = (STATIC_ROOT, BROKER)

DIRECTORY_MODE = 0o700
# Every file gpuadmin writes here, the key and the static files included (settings'
# FILE_UPLOAD_PERMISSIONS: Django's storages would chmod what collectstatic writes to 0644, and
# `exposure` would then refuse the next start).
FILE_MODE = 0o600
# Permission bits for "other users". Group bits are allowed: a deployment may
# give the directory to a group of its own (deploy/*.service, StateDirectoryMode).
OTHERS_BITS = stat.S_IRWXO


class DataDirNotPrepared(RuntimeError):
    """The data directory or its secret key is missing; the message says which command creates them."""


def data_dir() -> Path:
    """The data directory named by GPUADMIN_DATA_DIR (default ``var/`` in the checkout), absolute."""
    return Path(env_str("GPUADMIN_DATA_DIR", str(BASE_DIR / "var"))).resolve()


def secret_key(directory: Path) -> str:
    """GPUADMIN_SECRET_KEY (or its _FILE), else the key kept in the data directory. Reads only.

    The directory must exist either way: the database, the broker, the
    scheduler and the agent's journal all write into it.
    """
    if not directory.is_dir():
        raise DataDirNotPrepared(
            f"the data directory {directory} does not exist; create it with `{PREPARE_COMMAND}` "
            f"(`make run` does this), or set GPUADMIN_DATA_DIR to one that does"
        )
    key = env_secret(KEY_VARIABLE)
    if key:
        return key
    try:
        return (directory / KEY_FILE).read_text().strip()
    except FileNotFoundError:
        raise DataDirNotPrepared(
            f"the data directory {directory} has no secret key; create it with `{PREPARE_COMMAND}` "
            f"(`make run` does this), or set {KEY_VARIABLE}"
        ) from None


def central_signing_key_path(directory: Path) -> Path:
    """GPUADMIN_SIGNING_KEY_FILE, else the key kept in the data directory. Reads nothing."""
    named = env_str(SIGNING_KEY_FILE_VARIABLE)
    return Path(named) if named else directory / CENTRAL_SIGNING_KEY


def prepare_data_dir(directory: Path | None = None, *, central: bool = True) -> list[Path]:
    """Create the data directory, its secret key and its folders where missing; returns what it created.

    Safe to run again and from several processes at once: nothing that exists
    is changed, and the key file appears whole or not at all.
    """
    directory = directory or data_dir()
    created: list[Path] = []
    if not directory.is_dir():
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        # mkdir's mode passes through the umask; the key and every command line end up in here.
        directory.chmod(DIRECTORY_MODE)
        created.append(directory)
    for name in FOLDERS:
        folder = directory / name
        if not folder.is_dir():
            folder.mkdir(mode=DIRECTORY_MODE, exist_ok=True)
            created.append(folder)
    _make_private(directory / STATIC_ROOT)
    key_path = directory / KEY_FILE
    if not env_secret(KEY_VARIABLE) and not key_path.exists() and _write_secret_key(key_path):
        created.append(key_path)
    # A GPU host's agent (central=False) must hold no key that central's orders could be signed with.
    if central and not env_str(SIGNING_KEY_FILE_VARIABLE):
        from gpuadmin.wire.signing import create_private_key_file

        signing_key_path = directory / CENTRAL_SIGNING_KEY
        if create_private_key_file(signing_key_path):
            created.append(signing_key_path)
    return created


def _make_private(folder: Path) -> None:
    """Take other users' bits off what an older gpuadmin wrote into a folder of its own making.

    Static files written before FILE_UPLOAD_PERMISSIONS was set are 0644; they hold nothing
    secret and are rewritten at every start, so fixing them here spares an upgraded install a
    refusal it did not cause.
    """
    for path in (folder, *folder.rglob("*")):
        mode = path.lstat().st_mode
        if not path.is_symlink() and mode & OTHERS_BITS:
            path.chmod(stat.S_IMODE(mode) & ~OTHERS_BITS)


def exposure(directory: Path | None = None) -> str:
    """Why other users can read into the data directory, with the command that fixes it; "" if they cannot.

    Checks the directory and everything in it (it is small: the database, the
    broker's message files, the key), without following symbolic links.
    """
    directory = directory or data_dir()
    if not directory.is_dir():
        return ""
    exposed = [path for path in (directory, *directory.rglob("*"))
               if not path.is_symlink() and path.lstat().st_mode & OTHERS_BITS]
    if not exposed:
        return ""
    shown = ", ".join(f"{path} ({stat.filemode(path.lstat().st_mode)})" for path in exposed[:3])
    more = f" and {len(exposed) - 3} more" if len(exposed) > 3 else ""
    return (
        f"other users can read the data directory: {shown}{more}. It holds the database with the "
        f"login sessions and the secret key. Fix it with:  chmod -R go-rwx {directory}"
    )


def _write_secret_key(path: Path) -> bool:
    """Write a new key whole unless one exists (another process prepared it first: its key stands)."""
    return write_file(path, secrets.token_urlsafe(50), mode=FILE_MODE, replace=False)


@dataclass(frozen=True)
class SupervisorState:
    """What a running `make run` supervisor publishes about itself."""

    pid: int
    started_at: float  # seconds since the epoch
    restarts: int


def supervisor_state_path(directory: Path) -> Path:
    return Path(directory) / SUPERVISOR_STATE


def read_supervisor_state(directory: Path) -> SupervisorState | None:
    """The supervisor's published state, or None when no live supervisor runs on this data dir."""
    try:
        state = json.loads(supervisor_state_path(directory).read_text())
        published = SupervisorState(int(state["pid"]), float(state["started_at"]), int(state["restarts"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    try:
        os.kill(published.pid, 0)  # a file left by a supervisor that was SIGKILLed says nothing
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return published


def main() -> int:
    directory = data_dir()
    created = prepare_data_dir(directory)
    for path in created:
        print(f"created {path}")
    problem = exposure(directory)
    if problem:
        print(f"gpuadmin: {problem}", file=sys.stderr)
        return 1
    print(f"gpuadmin data directory {directory} is ready" + ("" if created else " (nothing to create)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
