"""python -m gpuadmin.agent — this GPU host's agent: a Celery worker on host.$GPUADMIN_HOST_NAME.

Configured from the environment only, and needs no database:

    GPUADMIN_HOST_NAME            this host's name (its queue is host.<name>)      required
    REDIS_URL                     the broker (redis://:password@host/0, rediss://)  required
      (or sentinel://host1:26379;sentinel://host2:26379 and GPUADMIN_REDIS_SENTINEL_MASTER)
    GPUADMIN_CENTRAL_PUBLIC_KEY   central's key, as `manage.py central_key` prints  required
      (or GPUADMIN_CENTRAL_PUBLIC_KEY_FILE)
    GPUADMIN_DATA_DIR             its journal and its own signing key               required
    GPUADMIN_GPU_BACKEND, GPUADMIN_AGENT_PROTECTED_EXECUTABLES, GPUADMIN_LOG_LEVEL ...  optional

Anything required missing or unreadable: one clear line and exit status 2.
On its first start it makes its own key pair in its data directory and logs
the fingerprint, which an approver compares before accepting the host. Celery's
remote control is off: a broker writer must not be able to shut it down,
change its pool or read its state through broadcast commands.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuadmin.env import env_secret
from gpuadmin.probe.config import HOST_NAME_PATTERN

EXIT_CONFIGURATION = 2
REQUIRED = ("GPUADMIN_HOST_NAME", "REDIS_URL", "GPUADMIN_DATA_DIR")


class ConfigurationError(RuntimeError):
    """Something the agent needs is missing or wrong; the message says what."""


def check_environment() -> tuple[str, Path]:
    """The host name and data directory, once every required variable is there and sane."""
    from gpuadmin.probe.kill.protected import ProtectedExecutables
    from gpuadmin.wire.signing import parse_public_key

    missing = [name for name in REQUIRED if not os.environ.get(name)]
    try:
        central_key = env_secret("GPUADMIN_CENTRAL_PUBLIC_KEY")
    except OSError as error:
        raise ConfigurationError(f"GPUADMIN_CENTRAL_PUBLIC_KEY_FILE cannot be read: {error}") from None
    if not central_key:
        missing.append("GPUADMIN_CENTRAL_PUBLIC_KEY (or GPUADMIN_CENTRAL_PUBLIC_KEY_FILE)")
    if missing:
        raise ConfigurationError(f"missing {', '.join(missing)} (see python -m gpuadmin.agent --help)")
    try:
        parse_public_key(central_key)
    except ValueError as error:
        raise ConfigurationError(f"GPUADMIN_CENTRAL_PUBLIC_KEY: {error}; use the line "
                                 "`manage.py central_key` prints on central") from None
    host_name = os.environ["GPUADMIN_HOST_NAME"]
    if not HOST_NAME_PATTERN.match(host_name):
        raise ConfigurationError(f"GPUADMIN_HOST_NAME {host_name!r} is not a host name")
    if not os.environ["REDIS_URL"].startswith(("redis://", "rediss://", "sentinel://")):
        raise ConfigurationError("REDIS_URL must be a redis:// or rediss:// URL, or sentinel:// with "
                                 "GPUADMIN_REDIS_SENTINEL_MASTER (Redis Sentinel)")
    try:
        ProtectedExecutables.from_env()
    except (ValueError, OSError) as error:  # re.error is a ValueError
        raise ConfigurationError(str(error)) from None
    return host_name, Path(os.environ["GPUADMIN_DATA_DIR"]).resolve()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        host_name, data_dir = check_environment()
    except ConfigurationError as error:
        print(f"gpuadmin agent: {error}", file=sys.stderr)
        return EXIT_CONFIGURATION
    from gpuadmin.data_dir import prepare_data_dir
    from gpuadmin.keys import ensure_agent_key
    from gpuadmin.wire.signing import fingerprint

    os.umask(0o077)
    prepare_data_dir(data_dir, central=False)
    key, created = ensure_agent_key(data_dir)
    state = "created" if created else "using"
    print(f"gpuadmin agent {host_name}: {state} signing key {data_dir / 'agent_signing_key'}, "
          f"fingerprint {fingerprint(key)}", flush=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
    os.environ.pop("DATABASE_URL", None)  # a GPU host holds no database credentials

    from celery.bin.celery import celery as celery_command

    from gpuadmin.celery import app, host_queue

    app.conf.worker_enable_remote_control = False
    # Celery's command itself, not app.worker_main, which drops the worker's exit status: a worker
    # stopped without a stop signal exits non-zero (gpuadmin/celery.py), and systemd must see it.
    status = celery_command.main(standalone_mode=False, prog_name="celery", args=[
        "-A", "gpuadmin.agent.worker", "worker", "-Q", host_queue(host_name), "-n", f"agent@{host_name}",
        "--loglevel", os.environ.get("GPUADMIN_LOG_LEVEL", "INFO"),
        # An agent has no peers to gossip with, and a broker writer could answer as one.
        "--without-gossip", "--without-mingle", *argv,
    ])
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
