"""The agent's own probe clock (``gpuadmin.agent.probing.ProbeClock``) in a real agent worker on a
real redis-server: a probe as it starts, then one every ``GPUADMIN_PROBE_INTERVAL`` seconds, with no
central worker and no beat to ask for them. Its messages wait in central's queues, where they are
counted by the host named in their signed text.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, host_queue
from gpuadmin.data_dir import prepare_data_dir
from tests.integration.helpers import UNREACHABLE_DATABASE, wait_until, write_gpus
from tests.services import RedisServer

pytestmark = [pytest.mark.services]

INTERVAL_SECONDS = 1
PROBES_AWAITED = 4  # the start's and three of the clock's


def sent_by(client: redis.Redis, host_name: str) -> int:
    """Messages in central's queues that name ``host_name`` (a name no other test uses)."""
    count = 0
    for queue in (CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE):
        for raw in client.lrange(queue, 0, -1):
            # The signed text is JSON within the task's JSON: the name shows as it is.
            if host_name.encode() in base64.b64decode(json.loads(raw)["body"]):
                count += 1
    return count


def test_an_agent_probes_at_its_start_and_then_every_interval_unasked(
    start_worker, redis_server: RedisServer, tmp_path: Path,
) -> None:
    host_name = f"clock-{uuid.uuid4().hex[:6]}"
    data_dir = tmp_path / "agent-data"
    prepare_data_dir(data_dir, central=False)
    gpus = tmp_path / "gpus.json"
    write_gpus(gpus, {})
    client = redis.Redis.from_url(redis_server.url)

    agent = start_worker("agent", host_queue(host_name), GPUADMIN_HOST_NAME=host_name,
                         GPUADMIN_DATA_DIR=str(data_dir), DATABASE_URL=UNREACHABLE_DATABASE,
                         GPUADMIN_GPU_BACKEND="simulated", GPUADMIN_SIMULATED_GPUS=str(gpus),
                         GPUADMIN_PROBE_INTERVAL=str(INTERVAL_SECONDS))
    ready_at = time.monotonic()

    wait_until(f"{PROBES_AWAITED} probes of {host_name}",
               lambda: sent_by(client, host_name) >= PROBES_AWAITED, [agent])
    elapsed = time.monotonic() - ready_at
    sent = sent_by(client, host_name)
    # On its clock, not faster: one at the start, then one an interval (a tick or two of slack).
    assert sent <= 1 + elapsed / INTERVAL_SECONDS + 2, (sent, elapsed)
    assert elapsed >= (PROBES_AWAITED - 2) * INTERVAL_SECONDS, (sent, elapsed)
    assert f"probing every {INTERVAL_SECONDS} s" in agent.log
    # Its requests went through its own queue, and it took every one.
    assert client.llen(host_queue(host_name)) == 0
