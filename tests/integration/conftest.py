"""Fixtures for the integration tests: real workers over a real redis-server."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import Worker
from tests.services import RedisServer, stop_process_group


@pytest.fixture
def start_worker(tmp_path: Path, redis_server: RedisServer) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(name: str, queues: str, **env_overrides: str) -> Worker:
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env.update({"REDIS_URL": redis_server.url, **env_overrides})
        argv = [sys.executable, "-m", "celery", "-A", "gpuadmin", "worker", "-Q", queues,
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
