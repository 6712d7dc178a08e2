"""Throwaway servers for tests: redis-server and PostgreSQL, each on a free port in a temp dir.

Used by tests/conftest.py (fixtures) and tests/with_postgres.py (a whole run on
PostgreSQL). A missing binary raises ServiceMissing with the reason; the caller
decides whether that skips or fails (GPUADMIN_REQUIRE_SERVICES=1: fail). A
server that is there but does not start raises ServiceFailed: always a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
# Debian's postgresql package keeps its binaries off PATH.
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class ServiceMissing(RuntimeError):
    """A server a test needs is not installed here; the message says what to install."""


class ServiceFailed(RuntimeError):
    """A server is installed but did not start; always an error, never a skip."""


def services_required() -> bool:
    return os.environ.get("GPUADMIN_REQUIRE_SERVICES") == "1"


def missing(reason: str) -> None:
    """A server a test needs cannot start: skip the test, or fail it under GPUADMIN_REQUIRE_SERVICES=1."""
    import pytest

    if services_required():
        pytest.fail(f"{reason} (GPUADMIN_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_binary(name: str, extra_dirs: list[str] | None = None) -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in sorted(extra_dirs or [], reverse=True):  # the newest version first
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ServiceMissing(f"{name} not found on PATH (Debian: apt-get install {_debian_package(name)})")


def _debian_package(binary: str) -> str:
    return {"redis-server": "redis-server", "runuser": "util-linux"}.get(binary, "postgresql")


def wait_for_port(port: int, process: subprocess.Popen, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceFailed(f"{what} exited with status {process.returncode}: {_tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise ServiceFailed(f"{what} did not listen on port {port} within {START_TIMEOUT_SECONDS:.0f} s")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen, timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM the process group a test started (start_new_session=True), SIGKILL it if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_seconds)
    # Whatever is left of the group (the leader may be gone, its children not).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- redis-server --------------------------------------------------------------


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen
    directory: Path
    password: str = ""
    argv: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop the server (a fault test's outage); ``start_again`` brings it back on the same port."""
        stop_process_group(self.process)

    def start_again(self) -> None:
        """Start redis-server again on its port, empty: it keeps nothing on disk (--save "")."""
        self.process = subprocess.Popen(list(self.argv), stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, self.process, "redis-server", self.directory / "redis.log")


@contextlib.contextmanager
def redis_server(password: str = "") -> Iterator[RedisServer]:
    """A throwaway redis-server; with ``password``, clients must AUTH (the URL carries it)."""
    binary = find_binary("redis-server")
    directory = Path(tempfile.mkdtemp(prefix="gpuadmin-redis-"))
    port = free_port()
    log_path = directory / "redis.log"
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(log_path),
        *(["--requirepass", password] if password else []),
    ]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    server: RedisServer | None = None
    try:
        wait_for_port(port, process, "redis-server", log_path)
        server = RedisServer(port=port, process=process, directory=directory, password=password,
                             argv=tuple(argv))
        yield server
    finally:
        stop_process_group(server.process if server else process)
        shutil.rmtree(directory, ignore_errors=True)


# --- PostgreSQL ----------------------------------------------------------------


@dataclass
class PostgresServer:
    port: int
    user: str
    socket_dir: Path
    database: str = "gpuadmin"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"


def _postgres_os_user() -> tuple[str, list[str]]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` system user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name, []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceMissing("running as root and there is no `postgres` user to run PostgreSQL as") from None
    return "postgres", [find_binary("runuser"), "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    bin_dirs = glob.glob(POSTGRES_BIN_GLOB)
    initdb = find_binary("initdb", bin_dirs)
    pg_ctl = find_binary("pg_ctl", bin_dirs)
    os_user, as_user = _postgres_os_user()
    # Not under pytest's tmp dirs: those are private to root, and the server runs as `postgres`.
    directory = Path(tempfile.mkdtemp(prefix="gpuadmin-postgres-"))
    data_dir, socket_dir, log_path = directory / "data", directory / "sockets", directory / "server.log"
    socket_dir.mkdir()
    if as_user:
        for path in (directory, socket_dir):
            shutil.chown(path, user=os_user)
    port = free_port()
    started = False
    try:
        _run([*as_user, initdb, "-D", str(data_dir), "-U", os_user, "--auth=trust",
              "--encoding=UTF8", "--no-locale", "--no-sync"], "initdb")
        options = f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off " \
                  "-c synchronous_commit=off -c full_page_writes=off"
        _run([*as_user, pg_ctl, "-D", str(data_dir), "-l", str(log_path), "-o", options, "-w",
              "-t", str(int(START_TIMEOUT_SECONDS)), "start"], "pg_ctl start", log_path)
        started = True
        server = PostgresServer(port=port, user=os_user, socket_dir=socket_dir)
        _run([*as_user, find_binary("createdb", bin_dirs), "-h", "127.0.0.1", "-p", str(port),
              "-U", os_user, server.database], "createdb")
        yield server
    finally:
        if started:
            subprocess.run([*as_user, pg_ctl, "-D", str(data_dir), "-m", "immediate", "-w", "stop"],
                           stdin=subprocess.DEVNULL, capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)


def _run(argv: list[str], what: str, log_path: Path | None = None) -> None:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        if log_path is not None:
            detail += "\n" + _tail(log_path)
        raise ServiceFailed(f"{what} failed with status {result.returncode}: {detail}")
