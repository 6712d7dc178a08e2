"""Helpers the integration tests share: real Celery workers in their own process groups.

The `start_worker` fixture starts them and stops every one at the end of the test;
`publish_to` makes this process publish to a given broker. Both are registered by
tests/integration/conftest.py and tests/browser/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection
from kombu import Connection

from gpuadmin.celery import app
from tests import services as servers
from tests.services import RedisServer, free_port, stop_process_group

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE_DATABASE = "postgresql://nobody@127.0.0.1:1/none"
READY_TIMEOUT_SECONDS = 60


def database_url_for_workers() -> str:
    """A URL for the database this test runs on, for a worker process (PostgreSQL only)."""
    settings = connection.settings_dict
    credentials = quote(settings["USER"] or "", safe="")
    if settings.get("PASSWORD"):
        credentials += ":" + quote(settings["PASSWORD"], safe="")
    host = settings.get("HOST") or "127.0.0.1"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgresql://{credentials}@{host}{port}/{quote(settings['NAME'], safe='')}"


class Worker:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while " ready." not in self.log:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not ready within {READY_TIMEOUT_SECONDS} s:\n{self.log}")
            time.sleep(0.1)


# A simulated GPU the agents under test read (GPUADMIN_SIMULATED_GPUS_FILE).
GPU_UUID = "GPU-e2e00000-0000-4000-8000-000000000001"
GiB = 2**30
TIMEOUT_SECONDS = 60


def write_gpus(path: Path, holders: dict[int, int]) -> None:
    path.write_text(json.dumps({
        "gpus": [{"uuid": GPU_UUID, "name": "Simulated e2e", "memory_total_bytes": 80 * GiB,
                  "extra_used_bytes": 0, "utilization_percent": 10}],
        "processes": [{"pid": pid, "gpu_uuid": GPU_UUID, "used_memory_bytes": used}
                      for pid, used in holders.items()],
    }))


def wait_until(what: str, check: Callable[[], object], workers: list[Worker]) -> object:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    logs = "\n\n".join(f"--- {w.name}\n{w.log[-6000:]}" for w in workers)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


@pytest.fixture
def start_worker(tmp_path: Path, redis_server: RedisServer) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(name: str, queues: str, **env_overrides: str) -> Worker:
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env.update({"REDIS_URL": redis_server.url, **env_overrides})
        app = "gpuadmin.agent.worker" if "host." in queues else "gpuadmin"  # agent code only where it runs
        argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues,
                "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--concurrency", "1", "--loglevel", "INFO",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]
        worker = Worker(name, argv, env, tmp_path / f"{name}.log")
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    # Every worker process group goes, even when the test failed half-way.
    for worker in started:
        if worker.process.poll() is None:
            os.killpg(worker.process.pid, signal.SIGTERM)
    for worker in started:
        stop_process_group(worker.process)


@pytest.fixture
def own_redis() -> Iterator[servers.RedisServer]:
    """A redis-server of this test alone, which it may stop and start again."""
    try:
        with servers.redis_server() as server:
            yield server
    except servers.ServiceMissing as missing:
        servers.missing(str(missing))


@pytest.fixture
def publish_to(monkeypatch):
    """Make this (test) process publish to the given broker, as central's web process would."""

    def _publish_to(url: str) -> None:
        original = app.send_task

        def via_broker(*args, **kwargs):
            with Connection(url) as broker:
                return original(*args, connection=broker, **kwargs)

        monkeypatch.setattr(app, "send_task", via_broker)

    return _publish_to


class TcpProxy:
    """A loopback TCP proxy to a server, for outages: ``down()`` refuses and cuts every connection
    (as a stopped server does), ``up()`` listens again on the same port.

    Used where stopping the real server would take the test's own database with it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for connection_socket in connections:
            with contextlib.suppress(OSError):
                connection_socket.shutdown(socket.SHUT_RDWR)
            connection_socket.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # down()
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for each in (source, sink):
                with contextlib.suppress(OSError):
                    each.shutdown(socket.SHUT_RDWR)


def start_central_and_agent(start_worker: Callable[..., Worker], host_name: str, tmp_path: Path,
                            gpus_file: Path) -> list[Worker]:
    """Central's worker and one agent for ``host_name`` on the simulated GPUs in ``gpus_file``, its
    data directory and key prepared as on a GPU host and its key accepted beforehand."""
    from gpuadmin.celery import host_queue
    from gpuadmin.data_dir import prepare_data_dir
    from tests.keys import accept, install_agent_key

    agent_data = tmp_path / "agent-data"
    prepare_data_dir(agent_data)
    install_agent_key(agent_data, host_name)
    accept(host_name)
    central_database = {} if connection.vendor == "sqlite" else {"DATABASE_URL": database_url_for_workers()}
    central = start_worker("central", "central", GPUADMIN_HOST_NAME=f"central-{host_name}",
                           **central_database)
    agent = start_worker(
        "agent", host_queue(host_name), GPUADMIN_HOST_NAME=host_name,
        GPUADMIN_DATA_DIR=str(agent_data), DATABASE_URL=UNREACHABLE_DATABASE,
        GPUADMIN_GPU_BACKEND="simulated", GPUADMIN_SIMULATED_GPUS=str(gpus_file),
    )
    return [central, agent]
