"""What the Django benchmarks share: a quiet machine, a throwaway data
directory, Django set up on it, and a broker of their own where they need one.

A test run on the same 2 CPUs would distort every figure, so a benchmark
waits for other pytest processes to end (10 s polls, 10 minutes at most),
then measures anyway with a warning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuadmin.data_dir import prepare_data_dir

QUIET_POLL_SECONDS = 10
QUIET_WAIT_MAX_SECONDS = 600


def _own_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def wait_until_no_pytest() -> None:
    mine = _own_ancestors()
    deadline = time.monotonic() + QUIET_WAIT_MAX_SECONDS
    while True:
        found = subprocess.run(["pgrep", "-f", "pytest"], capture_output=True, text=True, check=False)
        others = [int(p) for p in found.stdout.split() if int(p) not in mine]
        if not others:
            return
        if time.monotonic() >= deadline:
            print(f"warning: pytest still running after {QUIET_WAIT_MAX_SECONDS} s (pids {others}); "
                  "measuring anyway, figures may be disturbed", file=sys.stderr)
            return
        print(f"waiting for pytest to finish (pids {others}) ...", file=sys.stderr, flush=True)
        time.sleep(QUIET_POLL_SECONDS)


@contextlib.contextmanager
def throwaway_data_dir(prefix: str, *, wait: bool = True) -> Iterator[str]:
    """Wait for a quiet machine (unless ``wait`` is false), then point
    GPUADMIN_DATA_DIR at a new temporary directory, removed afterwards."""
    if wait:
        wait_until_no_pytest()
    data_dir = tempfile.mkdtemp(prefix=prefix)
    os.environ["GPUADMIN_DATA_DIR"] = data_dir
    prepare_data_dir(Path(data_dir))
    try:
        yield data_dir
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def setup_django(database_url: str | None = None) -> None:
    """Django on ``database_url``, or SQLite in the data directory: never a
    DATABASE_URL inherited from the shell, so no real database is touched by accident."""
    # The test client serves no collected static files: pages name them unhashed, as the tests do
    # (settings.STORAGES); the hashed names' manifest lookup is a dict read, nothing to measure.
    os.environ.setdefault("GPUADMIN_STATIC_HASHED", "0")
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "gpuadmin.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


@contextlib.contextmanager
def django_on_postgres(prefix: str, *, wait: bool = True, settings: Sequence[str] = ()) -> Iterator[Any]:
    """A throwaway data directory, a throwaway PostgreSQL (``settings``: more ``name=value`` for it) and
    Django set up on them; yields the server."""
    from tests import services

    with throwaway_data_dir(prefix, wait=wait), services.postgres_server(settings=settings) as server:
        setup_django(server.url)
        yield server


@contextlib.contextmanager
def django_with_redis(prefix: str, *, wait: bool = True) -> Iterator[str]:
    """A throwaway data directory, a redis-server of its own as the broker (REDIS_URL) and Django on
    SQLite set up on them; yields the broker's URL."""
    from tests import services

    with throwaway_data_dir(prefix, wait=wait), services.redis_server() as redis:
        os.environ["REDIS_URL"] = redis.url
        setup_django()
        yield redis.url
