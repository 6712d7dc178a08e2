"""What a broker writer gets, through real servers: nothing (docs/security.md).

A real redis-server, a central worker and an agent worker (no database) for
one enrolled host, a real trainer process as the target. Whoever can write to
Redis pushes: an unsigned order with a made-up request id and a SIGKILL-only
plan; a captured real order with one byte changed; the captured order again;
a forged "finished/refused" report for a real request; a snapshot signed by
this agent's key but naming another host. Each signals nothing and changes
nothing, and central shows and audits each.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from kombu import Connection

from gpuadmin.accounts.roles import Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import CENTRAL_QUEUE, app, host_queue
from gpuadmin.data_dir import prepare_data_dir
from gpuadmin.fleet.models import Host, LatestSnapshot, SnapshotRejection
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest, KillStep
from gpuadmin.kills.states import Status
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER, INGEST_SNAPSHOT, RECORD_KILL_PROGRESS
from tests.factories import snapshot
from tests.integration.helpers import (
    UNREACHABLE_DATABASE,
    GiB,
    database_url_for_workers,
    wait_until,
    write_gpus,
)
from tests.keys import accept, host_key, install_agent_key, signed_snapshot
from tests.kills.helpers import start_trainer
from tests.people import make_person
from tests.probe.kill.helpers import target_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PLAN = [{"signal": "SIGINT", "grace_seconds": 1}, {"signal": "SIGTERM", "grace_seconds": 2}]


def test_a_broker_writer_gets_nothing(start_worker, redis_server, tmp_path: Path, monkeypatch):
    host_name = f"atk-{uuid.uuid4().hex[:8]}"
    trainer, checkpoint = start_trainer(tmp_path, "ignore-sigint")
    victim, _ = start_trainer(tmp_path, "ignore-both")
    gpus_file = tmp_path / "gpus.json"
    write_gpus(gpus_file, {trainer.pid: 2 * GiB, victim.pid: GiB})
    published: list[tuple[str, list]] = []
    original = app.send_task

    def via_redis(name, args=None, *more, **options):
        published.append((name, args))
        with Connection(redis_server.url) as broker:
            return original(name, args, *more, connection=broker, **options)

    monkeypatch.setattr(app, "send_task", via_redis)

    def push(task: str, queue: str, message: object) -> None:
        """What anyone holding the broker URL can do: put any message in any queue."""
        with Connection(redis_server.url) as broker:
            original(task, args=[message], queue=queue, connection=broker)

    agent_dir = tmp_path / "agent-data"
    prepare_data_dir(agent_dir)
    install_agent_key(agent_dir, host_name)
    accept(host_name)
    try:
        on_sqlite = connection.vendor == "sqlite"
        central_database = {} if on_sqlite else {"DATABASE_URL": database_url_for_workers()}
        central = start_worker("central", "central", GPUADMIN_HOST_NAME=f"central-{host_name}",
                               **central_database)
        agent = start_worker(
            "agent", host_queue(host_name), GPUADMIN_HOST_NAME=host_name, GPUADMIN_DATA_DIR=str(agent_dir),
            DATABASE_URL=UNREACHABLE_DATABASE, GPUADMIN_GPU_BACKEND="simulated",
            GPUADMIN_SIMULATED_GPUS=str(gpus_file),
        )
        workers = [central, agent]
        wait_until("the first snapshot", lambda: LatestSnapshot.objects.filter(host__name=host_name).exists(),
                   workers)

        def refusals() -> list[AuditEvent]:
            return list(AuditEvent.objects.filter(action="order_refused", host_name=host_name)
                        .order_by("sequence"))

        # 1. An unsigned order, made-up request id, SIGKILL only: refused, audited, nothing signalled.
        forged = {"order_version": 2, "request_id": "999", "host": host_name, "boot_id": "x",
                  "deadline": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
                  "targets": [target_for(victim.pid)], "plan": [{"signal": "SIGKILL", "grace_seconds": 1}],
                  "approved_by": "mallory", "approved_at": datetime.now(UTC).isoformat()}
        push(EXECUTE_KILL_ORDER, host_queue(host_name), forged)
        wait_until("the forged order's refusal", lambda: len(refusals()) == 1, workers)
        assert refusals()[0].details["reason"] == "unsigned"
        assert victim.poll() is None

        # A real request, approved: its order is captured on the way.
        requester, approver = make_person("rick", Role.REQUESTER), make_person("april", Role.APPROVER)
        record = next(p for p in LatestSnapshot.objects.get(host__name=host_name).document["processes"]
                      if p["pid"] == trainer.pid)
        kill_request = services.file_request(requester, host=host_name, pid=trainer.pid, plan=PLAN,
                                             start_time_ticks=record["start_time_ticks"], reason="attack")
        services.approve(kill_request.pk, approver)
        wait_until("the real request to finish",
                   lambda: KillRequest.objects.get(pk=kill_request.pk).is_final, workers)
        kill_request.refresh_from_db()
        assert kill_request.status == Status.SUCCEEDED, kill_request.result_detail
        (captured,) = [args[0] for name, args in published if name == EXECUTE_KILL_ORDER]
        steps = KillStep.objects.filter(request=kill_request).count()

        # 2. The captured order aimed at the victim instead (one byte changed): refused.
        altered = dict(captured, text=captured["text"].replace(str(trainer.pid), str(victim.pid)))
        push(EXECUTE_KILL_ORDER, host_queue(host_name), altered)
        wait_until("the altered order's refusal", lambda: len(refusals()) == 2, workers)
        assert refusals()[1].details["reason"] == "bad_signature"
        assert victim.poll() is None

        # 3. The captured order replayed: answered from the journal, nothing executed again.
        push(EXECUTE_KILL_ORDER, host_queue(host_name), captured)
        wait_until("the replay's answer", lambda: "repeat delivery" in agent.log, workers)
        assert KillStep.objects.filter(request=kill_request).count() == steps
        assert not AuditEvent.objects.filter(kill_request_id=kill_request.pk, action="signal_sent",
                                             details_json__contains="repeat").exists()

        # 4. Forged progress for a real request (unsigned, its real order id): ignored, counted, shown.
        victim_ticks = target_for(victim.pid)["start_time_ticks"]
        other = services.file_request(requester, host=host_name, pid=victim.pid, plan=PLAN,
                                      start_time_ticks=victim_ticks, reason="a real, pending request")
        push(RECORD_KILL_PROGRESS, CENTRAL_QUEUE, {
            "request_id": other.order_request_id, "seq": 1, "event": "finished",
            "result": "refused", "at": datetime.now(UTC).isoformat(), "detail": "forged", "host": host_name})
        wait_until("the forged report's rejection",
                   lambda: Host.objects.get(name=host_name).rejected_message_count >= 1, workers)
        other.refresh_from_db()
        assert other.status == Status.PENDING and not other.steps.exists()

        # 5. A snapshot signed by this agent's key but naming another (enrolled) host: rejected.
        accept("bystander")
        push(INGEST_SNAPSHOT, CENTRAL_QUEUE, signed_snapshot(snapshot("bystander"), key=host_key(host_name)))
        wait_until("the other host's rejection",
                   lambda: Host.objects.get(name="bystander").rejected_message_count, workers)
        assert not LatestSnapshot.objects.filter(host__name="bystander").exists()
        assert AuditEvent.objects.filter(action="message_rejected", host_name="bystander").exists()
        assert SnapshotRejection.objects.filter(host_name="bystander").exists()
        assert victim.poll() is None and checkpoint.read_text().startswith("saved on SIGTERM")
    finally:
        for process in (trainer, victim):
            if process.poll() is None:
                process.kill()
                process.wait()
