"""A snapshot from the probe to the host page through real servers, after the host's enrolment.

A real redis-server, a real central Celery worker (`-Q central`, this test's
database) and a real agent worker (`-Q host.<name>`) whose DATABASE_URL points
at nothing (GPU hosts hold no database credentials), with a simulated GPU that
real processes hold memory on. The agent's start-up snapshot and then one
requested probe travel agent -> Redis -> central -> database -> host page.

The workers must see the test's data: on SQLite the test database is a file in
the run's GPUADMIN_DATA_DIR (tests/conftest.py), which the central worker
opens through the same settings; on PostgreSQL (tests/with_postgres.py) it gets
a DATABASE_URL naming the test database. Hence transactional_db: what the
workers write is committed, and serialized_rollback puts back the rows the
migrations made (the role groups) after the flush.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from django.db import connection
from django.test import Client
from kombu import Connection

from gpuadmin.celery import app, host_queue
from gpuadmin.data_dir import AGENT_SIGNING_KEY, prepare_data_dir
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.wire.signing import fingerprint, load_private_key
from gpuadmin.wire.task_names import PROBE_HOST
from tests.integration.helpers import UNREACHABLE_DATABASE, Worker, database_url_for_workers
from tests.services import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

GPU_UUID = "GPU-1e57f100-0000-4000-8000-000000000001"
GiB = 2**30
FLOW_TIMEOUT_SECONDS = 60


@pytest.fixture
def gpu_holders() -> Iterator[list[subprocess.Popen]]:
    """Two real processes for the simulated GPU's process list; one has markup in its command line."""
    code = "import time; time.sleep(600)"
    holders = [subprocess.Popen([sys.executable, "-c", code, "itest-trainer", "--tag=<b>bold</b>"]),
               subprocess.Popen([sys.executable, "-c", code, "itest-second-rank"])]
    yield holders
    for holder in holders:
        holder.kill()
        holder.wait()


def write_simulated_gpus(path: Path, holders: list[tuple[int, int]]) -> None:
    path.write_text(json.dumps({
        "gpus": [{"uuid": GPU_UUID, "name": "Simulated A100 itest", "memory_total_bytes": 40 * GiB,
                  "extra_used_bytes": 0, "utilization_percent": 55}],
        "processes": [{"pid": pid, "gpu_uuid": GPU_UUID, "used_memory_bytes": used} for pid, used in holders],
    }))


def wait_for_host(host_name: str, workers: list[Worker]) -> Host:
    """The host row once central has recorded the key its agent offered."""
    deadline = time.monotonic() + FLOW_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        host = Host.objects.filter(name=host_name).exclude(public_key="").first()
        if host is not None:
            return host
        time.sleep(0.2)
    logs = "\n\n".join(f"--- {w.name}\n{w.log}" for w in workers)
    raise AssertionError(f"{host_name} offered no key within {FLOW_TIMEOUT_SECONDS} s\n{logs}")


def wait_for_snapshot(host_name: str, pids: set[int], workers: list[Worker]) -> dict:
    """The host's latest stored snapshot, once it lists every pid in `pids`."""
    deadline = time.monotonic() + FLOW_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        host = Host.objects.filter(name=host_name).select_related("latest_snapshot").first()
        snapshot = getattr(host, "latest_snapshot", None) if host else None
        if snapshot is not None and pids <= {p["pid"] for p in snapshot.document["processes"]}:
            return snapshot.document
        time.sleep(0.2)
    logs = "\n\n".join(f"--- {w.name}\n{w.log}" for w in workers)
    wanted = f"{host_name} with pids {sorted(pids)}"
    raise AssertionError(f"no snapshot of {wanted} within {FLOW_TIMEOUT_SECONDS} s\n{logs}")


@pytest.fixture
def admin_page_client(client: Client, django_user_model: type) -> Client:
    admin = django_user_model.objects.create_superuser("itest-admin", password="itest-password-1")
    client.force_login(admin)
    return client


def test_a_snapshot_goes_from_a_database_less_agent_through_redis_to_the_host_page(
    start_worker: Callable[..., Worker], gpu_holders: list[subprocess.Popen], redis_server: RedisServer,
    admin_page_client: Client, tmp_path: Path,
) -> None:
    host_name = f"itest-{uuid.uuid4().hex[:8]}"
    central_host_name = f"central-{uuid.uuid4().hex[:8]}"
    first, second = gpu_holders
    gpus_file = tmp_path / "gpus.json"
    write_simulated_gpus(gpus_file, [(first.pid, 6 * GiB)])

    on_sqlite = connection.vendor == "sqlite"
    central_database = {} if on_sqlite else {"DATABASE_URL": database_url_for_workers()}
    central = start_worker("central", "central", GPUADMIN_HOST_NAME=central_host_name, **central_database)
    agent_data_dir = tmp_path / "agent-data"
    prepare_data_dir(agent_data_dir)  # as on a GPU host, before its agent starts
    agent = start_worker(
        "agent", host_queue(host_name),
        GPUADMIN_HOST_NAME=host_name,
        GPUADMIN_DATA_DIR=str(agent_data_dir),
        DATABASE_URL=UNREACHABLE_DATABASE,
        GPUADMIN_GPU_BACKEND="simulated",
        GPUADMIN_SIMULATED_GPUS=str(gpus_file),
    )
    workers = [central, agent]

    # 1. The agent's start-up snapshot, with nobody asking, offers its key: the host
    #    awaits acceptance, and nothing of the snapshot is stored or shown.
    agent_key = load_private_key(agent_data_dir / AGENT_SIGNING_KEY)
    host = wait_for_host(host_name, workers)
    assert host.awaiting_acceptance and host.key_fingerprint == fingerprint(agent_key)
    assert fingerprint(agent_key) in agent.log  # the agent logged it, for the approver to compare
    assert not LatestSnapshot.objects.filter(host=host).exists()
    assert host_name not in {h.name for h in Host.objects.for_listing()}

    # An approver accepts the fingerprint; the next snapshot is stored.
    trust.accept_host(host_name, actor_name="itest", expected_fingerprint=fingerprint(agent_key))
    with Connection(redis_server.url) as broker:
        app.send_task(PROBE_HOST, queue=host_queue(host_name), expires=30, connection=broker)
    document = wait_for_snapshot(host_name, {first.pid}, workers)
    assert document["host"]["name"] == host_name
    assert [(g["uuid"], g["memory_used_bytes"]) for g in document["gpus"]] == [(GPU_UUID, 6 * GiB)]

    # 2. A probe requested through Redis sees the GPU as it is now.
    write_simulated_gpus(gpus_file, [(first.pid, 6 * GiB), (second.pid, 2 * GiB)])
    with Connection(redis_server.url) as broker:
        app.send_task(PROBE_HOST, queue=host_queue(host_name), expires=30, connection=broker)
    document = wait_for_snapshot(host_name, {first.pid, second.pid}, workers)
    memory_by_pid = {p["pid"]: p["gpu_memory_bytes"] for p in document["processes"]}
    assert memory_by_pid[second.pid] == {GPU_UUID: 2 * GiB}

    # 3. The host page shows the GPU and the processes, escaped.
    response = admin_page_client.get(f"/hosts/{host_name}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Simulated A100 itest" in page
    assert str(first.pid) in page and str(second.pid) in page
    assert "itest-trainer" in page and "itest-second-rank" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page

    # The agent worked without a database (its DATABASE_URL leads nowhere); only central stored.
    assert "sent a snapshot of " + host_name in agent.log
    assert "OperationalError" not in agent.log, agent.log
    assert not (agent_data_dir / "gpuadmin.sqlite3").exists()
    # A central-only worker queues no probe for itself on start-up.
    assert not redis.Redis.from_url(redis_server.url).exists(host_queue(central_host_name))
