"""Snapshot updates through a real redis-server and real workers: their own queue, taken in batches.

Updates sent by the agents' own path (``gpuadmin.sending.send_snapshot_update``) wait in
``central.updates`` while no central worker runs; an agent-only worker (``-Q host.<name>``) leaves them
there. A central worker (``-Q central``, this test's database) then applies them, many per call
(gpuadmin/fleet/update_batches.py logs each batch with its size), drops an expired one and a message of
another task without running it, and leaves nothing of the queue in Redis, waiting or unacknowledged.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from django.db import connection

from gpuadmin.celery import CENTRAL_QUEUE, CENTRAL_UPDATES_QUEUE, app, host_queue
from gpuadmin.data_dir import prepare_data_dir
from gpuadmin.fleet.models import LatestSnapshot, SnapshotRejection
from gpuadmin.sending import send_snapshot_update
from gpuadmin.wire.task_names import INGEST_SNAPSHOT_UPDATE
from tests.fleet.helpers import stored_with_updates
from tests.integration.held_tasks import NOTE
from tests.integration.helpers import (
    UNREACHABLE_DATABASE,
    Worker,
    database_url_for_workers,
    wait_until,
    write_gpus,
)
from tests.services import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

HOSTS = 25
UPDATES_PER_HOST = 2
BATCH_LINE = re.compile(r"applied a batch of (\d+) snapshot updates")


def unacknowledged_updates(broker: redis.Redis) -> list[str]:
    """The delivery tags of messages from ``central.updates`` taken but not acknowledged."""
    entries = cast(dict[bytes, bytes], broker.hgetall("unacked"))
    return [tag.decode() for tag, entry in entries.items() if json.loads(entry)[2] == CENTRAL_UPDATES_QUEUE]


def emptied_broker(url: str) -> redis.Redis:
    """The session's redis-server, without the queues of central: a worker an earlier test killed may
    have left messages there, taken and never acknowledged in kombu's bookkeeping."""
    broker = redis.Redis.from_url(url)
    broker.delete(CENTRAL_UPDATES_QUEUE, CENTRAL_QUEUE, "unacked", "unacked_index")
    return broker


def hosts_with_updates(prefix: str, hosts: int, count: int,
                       tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """``hosts`` hosts, each with its full snapshot (5 minutes ago) stored and ``count`` updates to send."""
    taken_at = datetime.now(UTC) - timedelta(minutes=5)
    return {name: stored_with_updates(name, tmp_path / f"{name}.json", taken_at=taken_at, count=count)
            for name in (f"{prefix}-{n:02d}" for n in range(hosts))}


def central_database() -> dict[str, str]:
    """The workers' DATABASE_URL: this test's database (SQLite's file is found without one)."""
    return {} if connection.vendor == "sqlite" else {"DATABASE_URL": database_url_for_workers()}


def test_a_central_worker_applies_queued_snapshot_updates_in_batches_and_an_agent_leaves_them(
    start_worker: Callable[..., Worker], publish_to: Callable[[str], None], redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    broker = emptied_broker(redis_server.url)
    updates = hosts_with_updates("gpu-batch", HOSTS, UPDATES_PER_HOST, tmp_path)
    names = list(updates)
    [late] = stored_with_updates("gpu-batch-late", tmp_path / "late.json",
                                 taken_at=datetime.now(UTC) - timedelta(minutes=5))
    publish_to(redis_server.url)
    for round_number in range(UPDATES_PER_HOST):  # as agents send them: a round of every host, then the next
        for name in names:
            send_snapshot_update(updates[name][round_number])
    app.send_task(INGEST_SNAPSHOT_UPDATE, args=[late], queue=CENTRAL_UPDATES_QUEUE,
                  expires=datetime.now(UTC) - timedelta(seconds=1))
    notes = tmp_path / "notes.txt"
    app.send_task(NOTE, args=[str(notes), "ran"], queue=CENTRAL_UPDATES_QUEUE)
    queued = HOSTS * UPDATES_PER_HOST + 2
    assert (broker.llen(CENTRAL_UPDATES_QUEUE), broker.llen(CENTRAL_QUEUE)) == (queued, 0)

    # An agent-only worker (python -m gpuadmin.agent's -Q host.<name>) takes none of them.
    agent_name = f"itest-agent-{uuid.uuid4().hex[:6]}"
    agent_data = tmp_path / "agent-data"
    prepare_data_dir(agent_data)
    gpus_file = tmp_path / "gpus.json"
    write_gpus(gpus_file, {})
    # Its own clock probes once, as it starts: a second probe would send an update of its own to
    # central.updates (refused, its key not accepted, but one more in the batches counted below), which
    # a slow machine's start of the central worker let happen.
    agent = start_worker("agent", host_queue(agent_name), GPUADMIN_HOST_NAME=agent_name,
                         GPUADMIN_DATA_DIR=str(agent_data), DATABASE_URL=UNREACHABLE_DATABASE,
                         GPUADMIN_GPU_BACKEND="simulated", GPUADMIN_SIMULATED_GPUS=str(gpus_file),
                         GPUADMIN_TASK_LOG_LEVEL="INFO", GPUADMIN_PROBE_INTERVAL="3600")
    wait_until("the agent's start-up snapshot", lambda: "sent a snapshot of" in agent.log, [agent])
    assert broker.llen(CENTRAL_UPDATES_QUEUE) == queued
    assert "snapshot updates" not in agent.log, agent.log

    central = start_worker("central", CENTRAL_QUEUE, GPUADMIN_HOST_NAME=f"central-{agent_name}",
                           GPUADMIN_TASK_LOG_LEVEL="INFO", **central_database())
    workers = [agent, central]
    taking = f"taking snapshot updates from {CENTRAL_UPDATES_QUEUE} in batches of up to 200"
    assert f"{taking} (200 at a time off Redis)" in central.log

    def applied() -> bool:
        latest = LatestSnapshot.objects.filter(host__name__in=names)
        return sorted(latest.values_list("update_sequence", flat=True)) == [UPDATES_PER_HOST] * HOSTS

    wait_until("every update applied", applied, workers)
    # kombu's Redis keeps a delivered message in "unacked" until it is acknowledged, whoever took it: the
    # agent's and the central task consumer's own may wait there too (a retried task's countdown).
    wait_until("nothing from the queue left in Redis", lambda: (
        broker.llen(CENTRAL_UPDATES_QUEUE) == 0 and not unacknowledged_updates(broker)), workers)
    sizes = [int(size) for size in BATCH_LINE.findall(central.log)]
    assert sum(sizes) == HOSTS * UPDATES_PER_HOST, central.log
    assert len(sizes) < HOSTS * UPDATES_PER_HOST // 5, sizes  # batches, not one call per message
    # The expired update and the other task's message were dropped, neither applied nor run.
    assert LatestSnapshot.objects.get(host__name="gpu-batch-late").update_sequence == 0
    assert "dropped an expired snapshot update" in central.log
    assert f"dropped a message for task '{NOTE}'" in central.log
    time.sleep(0.5)  # had it been run by a pool process, its line would be there by now
    assert not notes.exists()
    assert "Traceback" not in central.log, central.log


def test_a_central_worker_takes_updates_again_once_redis_is_back(
    start_worker: Callable[..., Worker], publish_to: Callable[[str], None], own_redis: RedisServer,
    tmp_path: Path,
) -> None:
    # Its taker finds Redis gone at its next take (no BRPOP waits there): Celery's reconnect must follow.
    first, second = stored_with_updates("gpu-batch-outage", tmp_path / "outage.json",
                                        taken_at=datetime.now(UTC) - timedelta(minutes=5), count=2)
    publish_to(own_redis.url)
    central = start_worker("central", CENTRAL_QUEUE, GPUADMIN_HOST_NAME="central-outage",
                           REDIS_URL=own_redis.url, GPUADMIN_TASK_LOG_LEVEL="INFO", **central_database())

    def sequence() -> int:
        return LatestSnapshot.objects.get(host__name="gpu-batch-outage").update_sequence

    send_snapshot_update(first)
    wait_until("the first update applied", lambda: sequence() == 1, [central])
    own_redis.stop()
    wait_until("the worker to see Redis gone", lambda: "Connection to broker lost" in central.log, [central])
    own_redis.start_again()
    send_snapshot_update(second)
    wait_until("the second update applied", lambda: sequence() == 2, [central])
    assert central.process.poll() is None
    assert "Error in timer" not in central.log, central.log  # the loop's, for an error it did not let out


def test_two_central_workers_apply_every_update_whichever_takes_it(
    start_worker: Callable[..., Worker], publish_to: Callable[[str], None], redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    # Each takes what is queued when it looks: a host's update can reach one worker before its earlier
    # one, in the other's batch, is applied. It waits for it, where it was refused as a gap.
    emptied_broker(redis_server.url)
    updates = hosts_with_updates("gpu-two", 30, 6, tmp_path)
    names = list(updates)
    publish_to(redis_server.url)
    workers = [start_worker(f"central-{side}", CENTRAL_QUEUE, GPUADMIN_HOST_NAME=f"central-two-{side}",
                            GPUADMIN_TASK_LOG_LEVEL="INFO", **central_database()) for side in "ab"]
    for round_number in range(6):
        for name in names:
            send_snapshot_update(updates[name][round_number])

    def applied() -> bool:
        latest = LatestSnapshot.objects.filter(host__name__in=names)
        return sorted(latest.values_list("update_sequence", flat=True)) == [6] * len(names)

    wait_until("every update applied", applied, workers)
    assert not SnapshotRejection.objects.filter(host_name__in=names).exists()
    taken = [sum(int(size) for size in BATCH_LINE.findall(worker.log)) for worker in workers]
    assert sum(taken) == 6 * len(names), taken
    assert all("Traceback" not in worker.log for worker in workers)
