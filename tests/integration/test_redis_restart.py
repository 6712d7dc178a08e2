"""A worker keeps consuming after Redis stops and comes back empty, even when an ack failed
during the outage (gpuadmin/celery.py: StalledConsumerGuard).

What made central deaf (a flaky test_faults run): at concurrency 1 one task runs and the next is
already fetched, waiting for the pool process; Redis stops; the waiting one's ack fails ("Couldn't
ack"), kombu never gives its prefetch credit back, and with no BRPOP pending kombu drops the dead
socket without a word: no "Connection to broker lost", no reconnect, never a message again.

The worker consumes one queue, a host's, as an agent's worker does: a worker that consumes `central`
also takes snapshot updates off Redis itself (gpuadmin/fleet/update_batches.py), and finds Redis gone
at its next take, a tenth of a second later (tests/integration/test_update_batches.py).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from gpuadmin.celery import STALLED_CONSUMER_LOG, app, host_queue
from tests import services as servers
from tests.integration.held_tasks import HOLD, NOTE
from tests.integration.helpers import Worker, wait_until
from tests.services import stop_process_group

pytestmark = pytest.mark.services

HOLD_SECONDS = 1.5
HELD_QUEUE = host_queue("redis-restart")


@pytest.fixture
def held_worker(tmp_path: Path, own_redis: servers.RedisServer) -> Iterator[Worker]:
    """A worker of one host queue, concurrency 1 as in the tests, with tests.integration.held_tasks loaded."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(REDIS_URL=own_redis.url, GPUADMIN_HOST_NAME="central-redis-restart")
    argv = [sys.executable, "-m", "celery", "-A", "tests.integration.held_tasks", "worker",
            "-Q", HELD_QUEUE, "-n", "central-restart@%h", "--concurrency", "1", "--loglevel", "INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]
    worker = Worker("central", argv, env, tmp_path / "central.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        stop_process_group(worker.process)


def test_a_worker_whose_ack_failed_while_redis_was_down_consumes_again_once_redis_is_back(
    held_worker: Worker, own_redis: servers.RedisServer, tmp_path: Path,
) -> None:
    started, notes = tmp_path / "started", tmp_path / "notes"

    def send(name: str, *args: object) -> None:
        with Connection(own_redis.url) as broker:
            app.send_task(name, args=list(args), connection=broker, queue=HELD_QUEUE)

    def noted() -> list[str]:
        return notes.read_text().split() if notes.exists() else []

    send(HOLD, str(started), HOLD_SECONDS)
    send(NOTE, str(notes), "fetched-before-the-outage")
    # The first runs and the second is fetched from Redis, waiting for the pool process.
    queued = redis.Redis.from_url(own_redis.url)
    wait_until("the first task running, the second fetched",
               lambda: started.exists() and queued.llen(HELD_QUEUE) == 0, [held_worker])
    queued.close()

    own_redis.stop()
    # The second starts once the first is done: its ack (sent as it starts) meets no Redis.
    wait_until("the fetched task's ack to fail", lambda: "Couldn't ack" in held_worker.log, [held_worker])
    own_redis.start_again()  # empty

    send(NOTE, str(notes), "sent-once-redis-is-back")
    deadline = time.monotonic() + 30
    while "sent-once-redis-is-back" not in noted() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = held_worker.log
    assert noted() == ["fetched-before-the-outage", "sent-once-redis-is-back"], log
    assert STALLED_CONSUMER_LOG in log
