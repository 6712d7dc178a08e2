"""Request → approval → signals on a real process → audit → memory released, through real servers.

A real redis-server, a central Celery worker (this test's database) and an
agent worker on `host.<name>` whose DATABASE_URL leads nowhere, with a
simulated GPU on which a real process holds memory. The process ignores
SIGINT and checkpoints on SIGTERM. After the kill, the simulated GPU no
longer lists it; the next snapshot confirms the memory came back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from gpuadmin.accounts.roles import Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app, host_queue
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.wire.task_names import PROBE_HOST
from tests.integration.helpers import GiB, start_central_and_agent, wait_until, write_gpus
from tests.kills.helpers import start_trainer
from tests.people import make_person
from tests.services import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PLAN = [
    {"signal": "SIGINT", "grace_seconds": 1},
    {"signal": "SIGTERM", "grace_seconds": 3},
    {"signal": "SIGKILL", "grace_seconds": 3},
]


def test_request_approve_signal_audit_memory_released(
    start_worker, redis_server: RedisServer, tmp_path: Path, publish_to,
):
    requester = make_person("rick", Role.REQUESTER)
    approver = make_person("april", Role.APPROVER)
    host_name = f"e2e-{uuid.uuid4().hex[:8]}"
    trainer, checkpoint = start_trainer(tmp_path, "ignore-sigint")
    gpus_file = tmp_path / "gpus.json"
    write_gpus(gpus_file, {trainer.pid: 6 * GiB})
    publish_to(redis_server.url)
    try:
        workers = start_central_and_agent(start_worker, host_name, tmp_path, gpus_file)
        central, agent = workers

        # The agent's start-up snapshot shows the trainer holding 6 GiB.
        def snapshot_with_trainer():
            latest = LatestSnapshot.objects.filter(host__name=host_name).first()
            rows = {p["pid"]: p for p in latest.document["processes"]} if latest else {}
            return rows.get(trainer.pid)

        record = wait_until("the trainer in a snapshot", snapshot_with_trainer, workers)
        kill_request = services.file_request(
            requester, host=host_name, pid=trainer.pid, start_time_ticks=record["start_time_ticks"],
            plan=PLAN, reason="e2e: finished job still holding 6 GiB",
        )
        services.approve(kill_request.pk, approver)  # commits; the order leaves on commit

        def final():
            kill_request.refresh_from_db()
            return kill_request.is_final

        wait_until("the request to finish", final, workers)
        assert kill_request.status == Status.SUCCEEDED, (kill_request.result_detail, central.log, agent.log)
        trainer.wait(timeout=10)
        assert checkpoint.read_text().startswith("saved on SIGTERM")
        assert [(s.event, s.signal) for s in kill_request.steps.order_by("seq")] == [
            ("started", ""), ("signal_sent", "SIGINT"), ("signal_sent", "SIGTERM"),
            ("target_exited", "SIGTERM"), ("finished", ""),
        ]
        assert kill_request.dispatched_at is not None

        # A later snapshot: the simulated GPU no longer lists the trainer.
        write_gpus(gpus_file, {})
        app.send_task(PROBE_HOST, queue=host_queue(host_name), expires=30)

        def confirmed():
            kill_request.refresh_from_db()
            return kill_request.memory_confirmed_at

        wait_until("the released memory to be confirmed", confirmed, workers)
        assert kill_request.memory_expected_release_bytes == 6 * GiB
        assert kill_request.memory_released_bytes == 6 * GiB

        actions = list(AuditEvent.objects.filter(kill_request_id=kill_request.pk)
                       .order_by("sequence").values_list("action", flat=True))
        assert actions == [
            "requested", "approved", "dispatched", "started", "signal_sent", "signal_sent",
            "target_exited", "finished", "memory_released",
        ]
        assert "OperationalError" not in agent.log
        assert Host.objects.get(name=host_name)
        assert KillRequest.objects.count() == 1
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
