"""Celery's remote control through the broker reaches no gpuadmin worker (docs/security.md, issue 30).

A real central worker, started as the deploy unit starts it, on a real redis-server. Whoever can
write to Redis (every GPU host holds the URL) broadcasts what once stopped, steered and read
central: `shutdown` six times (`make run` gave up after that), `add_consumer host.gpu2` (central
took gpu2's kill order), `inspect conf` (every setting, the broker's password included) and a ping.
Nobody answers, the worker keeps running and keeps exactly its own queue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import redis
from kombu import Connection

from gpuadmin.celery import CENTRAL_QUEUE, app, host_queue
from tests.integration.helpers import REPO

pytestmark = pytest.mark.services

# What a broker writer runs: gpuadmin's own Celery app pointed at the broker (REDIS_URL), as
# `celery -A gpuadmin control ...` would be. Each command waits `wait` seconds for answers; the
# shutdowns after the first only `again`: a worker that obeyed one is found by what follows (it
# dies, never takes the next message, logs its shutdown), however long its answer takes.
BROADCASTS = """
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
from gpuadmin.celery import app
wait, again, other_queue = 2.0, 0.5, sys.argv[1]
answers = {
    "ping": app.control.ping(timeout=wait),
    "inspect conf": app.control.inspect(timeout=wait).conf(),
    "add_consumer": app.control.add_consumer(other_queue, reply=True, timeout=wait),
    # What `make run` gave up after: six deaths within five minutes.
    "shutdown": [app.control.broadcast("shutdown", reply=True, timeout=wait if n == 0 else again)
                 for n in range(6)],
}
print(json.dumps(answers))
"""


def broadcast(redis_url: str, other_queue: str) -> dict[str, object]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env["REDIS_URL"] = redis_url
    done = subprocess.run([sys.executable, "-c", BROADCASTS, other_queue], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_broadcasts_through_the_broker_get_no_answer_and_change_nothing(start_worker, redis_server) -> None:
    other_host = host_queue(f"gpu2-{uuid.uuid4().hex[:6]}")
    central = start_worker("central", CENTRAL_QUEUE, GPUADMIN_HOST_NAME=f"central-{uuid.uuid4().hex[:6]}")
    broker_keys = redis.Redis.from_url(redis_server.url)
    answers = broadcast(redis_server.url, other_host)
    assert answers == {"ping": [], "inspect conf": None, "add_consumer": [], "shutdown": [[]] * 6}, answers
    # No worker binds the broadcast exchange: the commands above wait in no queue either.
    assert not broker_keys.smembers("_kombu.binding.celery.pidbox")
    assert central.process.poll() is None, central.log

    # Its own queue still consumed, the other host's left alone: a message in each, both unknown
    # task names (a worker that takes one discards it and says so).
    with Connection(redis_server.url) as broker:
        app.send_task("gpuadmin.test.for_the_other_host", queue=other_host, connection=broker)
        app.send_task("gpuadmin.test.for_central", queue=CENTRAL_QUEUE, connection=broker)
    deadline = time.monotonic() + 30
    while "gpuadmin.test.for_central" not in central.log:
        assert time.monotonic() < deadline, central.log
        assert central.process.poll() is None, central.log
        time.sleep(0.1)
    assert broker_keys.llen(other_host) == 1
    assert "gpuadmin.test.for_the_other_host" not in central.log
    assert central.process.poll() is None, central.log
    assert "shutdown" not in central.log.lower(), central.log
