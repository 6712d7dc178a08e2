"""Faults survived, with real processes and servers: the broker down when an approval
commits, an agent SIGKILLed in the middle of a ladder, the database down during ingest.

The faults tried at the executor's level (the same order ten times, a host
clock ten minutes off, PID reuse) are in tests/probe/kill/; the central side
of clock skew in tests/kills/test_host_clock.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection
from django.utils import timezone

from gpuadmin.accounts.roles import Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.celery import app, host_queue
from gpuadmin.data_dir import AGENT_JOURNAL, prepare_data_dir
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.kills import services
from gpuadmin.kills.models import START_REPORT_MARGIN, KillRequest
from gpuadmin.kills.services.sweeper import sweep
from gpuadmin.kills.states import Status
from gpuadmin.probe.journal import Journal
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER, PROBE_HOST
from tests import services as servers
from tests.integration.helpers import (
    UNREACHABLE_DATABASE,
    GiB,
    TcpProxy,
    Worker,
    database_url_for_workers,
    wait_until,
    write_gpus,
)
from tests.keys import accept, install_agent_key
from tests.kills.helpers import start_trainer
from tests.people import make_person

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PLAN = [{"signal": "SIGINT", "grace_seconds": 2}, {"signal": "SIGTERM", "grace_seconds": 3}]


class Lab:
    """One agent host with a simulated GPU, enrolled, and the workers of a test."""

    def __init__(self, tmp_path: Path, start_worker: Callable[..., Worker], redis_url: str) -> None:
        self.name = f"fault-{uuid.uuid4().hex[:8]}"
        self.tmp_path, self.start_worker, self.redis_url = tmp_path, start_worker, redis_url
        self.data_dir = tmp_path / "agent-data"
        self.gpus_file = tmp_path / "gpus.json"
        prepare_data_dir(self.data_dir, central=False)
        install_agent_key(self.data_dir, self.name)
        accept(self.name)
        self.workers: list[Worker] = []

    def central(self, **env: str) -> Worker:
        database = {} if connection.vendor == "sqlite" else {"DATABASE_URL": database_url_for_workers()}
        worker = self.start_worker("central", "central", REDIS_URL=self.redis_url,
                                   GPUADMIN_HOST_NAME=f"central-{self.name}", **{**database, **env})
        self.workers.append(worker)
        return worker

    def agent(self, label: str = "agent") -> Worker:
        worker = self.start_worker(
            label, host_queue(self.name), REDIS_URL=self.redis_url, GPUADMIN_HOST_NAME=self.name,
            GPUADMIN_DATA_DIR=str(self.data_dir), DATABASE_URL=UNREACHABLE_DATABASE,
            GPUADMIN_GPU_BACKEND="simulated", GPUADMIN_SIMULATED_GPUS=str(self.gpus_file),
        )
        self.workers.append(worker)
        return worker

    def record_of(self, pid: int) -> dict[str, Any] | None:
        latest = LatestSnapshot.objects.filter(host__name=self.name).first()
        rows = {p["pid"]: p for p in latest.document["processes"]} if latest else {}
        return rows.get(pid)

    def file(self, requester: Any, trainer: subprocess.Popen, reason: str) -> KillRequest:
        record = wait_until(f"PID {trainer.pid} in a snapshot", lambda: self.record_of(trainer.pid),
                            self.workers)
        assert isinstance(record, dict)
        return services.file_request(requester, host=self.name, pid=trainer.pid,
                                     start_time_ticks=record["start_time_ticks"], plan=PLAN, reason=reason)

    def journal(self) -> Journal:
        return Journal(self.data_dir / AGENT_JOURNAL)

    def wait_final(self, kill_request: KillRequest) -> KillRequest:
        def final() -> bool:
            kill_request.refresh_from_db()
            return kill_request.is_final

        wait_until(f"request {kill_request.pk} to finish", final, self.workers)
        return kill_request


def _stop(*trainers: subprocess.Popen) -> None:
    for trainer in trainers:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


def test_an_order_approved_while_redis_is_down_leaves_when_it_is_back_or_expires_unrun(
    start_worker, own_redis: servers.RedisServer, tmp_path: Path, publish_to, settings,
):
    requester = make_person("rick", Role.REQUESTER)
    approver = make_person("april", Role.APPROVER)
    publish_to(own_redis.url)
    late_trainer, _ = start_trainer(tmp_path, "ignore-sigint")
    back_trainer, back_checkpoint = start_trainer(tmp_path, "ignore-sigint")
    lab = Lab(tmp_path, start_worker, own_redis.url)
    write_gpus(lab.gpus_file, {late_trainer.pid: 2 * GiB, back_trainer.pid: 3 * GiB})
    try:
        lab.central()
        lab.agent()
        late = lab.file(requester, late_trainer, "faults: approved while Redis is down, back too late")
        back = lab.file(requester, back_trainer, "faults: approved while Redis is down, back in time")

        own_redis.stop()
        settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS = 3
        services.approve(late.pk, approver)  # the approval commits; its order cannot leave
        late.refresh_from_db()
        assert late.status == Status.APPROVED and late.dispatched_at is None
        assert late.dispatch_attempts == 1 and late.last_dispatch_error
        settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS = 120
        services.approve(back.pk, approver)
        back.refresh_from_db()
        assert back.dispatched_at is None and back.last_dispatch_error

        assert late.start_deadline is not None
        deadline = late.start_deadline
        wait_until("the first order's deadline to pass", lambda: timezone.now() > deadline, lab.workers)
        own_redis.start_again()  # empty: whatever was queued before the outage is gone

        def resent() -> bool:
            sweep()  # what beat's sweeper does every few seconds
            back.refresh_from_db()
            return back.dispatched_at is not None

        wait_until("the sweeper to send the order once Redis is back", resent, lab.workers)
        lab.wait_final(back)
        assert back.status == Status.SUCCEEDED, back.result_detail
        assert back_checkpoint.read_text().startswith("saved on SIGTERM")
        assert back.dispatch_attempts >= 2

        # The one whose deadline passed during the outage never left, and expires.
        late.refresh_from_db()
        assert late.status == Status.APPROVED and late.dispatched_at is None
        sweep(now=deadline + START_REPORT_MARGIN)  # the sweeper, once central's report margin is over
        late.refresh_from_db()
        assert late.status == Status.EXPIRED and late.dispatched_at is None
        assert "could not be sent to the host before its start deadline" in late.result_detail
        assert lab.journal().read(late.order_request_id) is None
        assert late_trainer.poll() is None
        assert not late.steps.exists()
    finally:
        _stop(late_trainer, back_trainer)


def test_an_agent_killed_mid_ladder_neither_restarts_it_nor_acts_after_the_deadline(
    start_worker, redis_server: servers.RedisServer, tmp_path: Path, publish_to, *, settings, monkeypatch,
):
    requester = make_person("rick", Role.REQUESTER)
    approver = make_person("april", Role.APPROVER)
    settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS = 20
    publish_to(redis_server.url)
    orders: list[dict[str, Any]] = []
    publishing = app.send_task

    def keep_orders(name: str, *args: Any, **options: Any) -> Any:
        if name == EXECUTE_KILL_ORDER:
            orders.append(options["args"][0])
        return publishing(name, *args, **options)

    monkeypatch.setattr(app, "send_task", keep_orders)
    trainer, checkpoint = start_trainer(tmp_path, "ignore-sigint")
    lab = Lab(tmp_path, start_worker, redis_server.url)
    write_gpus(lab.gpus_file, {trainer.pid: 4 * GiB})
    long_plan = [{"signal": "SIGINT", "grace_seconds": 60}, {"signal": "SIGTERM", "grace_seconds": 5}]
    try:
        lab.central()
        first_agent = lab.agent("agent")
        record = wait_until("the trainer in a snapshot", lambda: lab.record_of(trainer.pid), lab.workers)
        assert isinstance(record, dict)
        kill_request = services.file_request(requester, host=lab.name, pid=trainer.pid,
                                             start_time_ticks=record["start_time_ticks"], plan=long_plan,
                                             reason="faults: agent killed mid-ladder")
        services.approve(kill_request.pk, approver)
        wait_until("the SIGINT step", lambda: kill_request.steps.filter(event="signal_sent").exists(),
                   lab.workers)

        # SIGKILL, mid-grace: the agent's main process and its pool child, at once.
        os.killpg(first_agent.process.pid, signal.SIGKILL)
        first_agent.process.wait()
        lab.workers.remove(first_agent)
        lab.agent("agent-restarted")
        # Redis hands an unacknowledged order out again once its visibility timeout is over (an
        # hour); it is handed out again here at once, exactly as delivered the first time.
        (message,) = orders
        app.send_task(EXECUTE_KILL_ORDER, args=[message], queue=host_queue(lab.name))
        lab.wait_final(kill_request)
        assert kill_request.status == Status.FAILED
        assert kill_request.result_detail.startswith("interrupted on the host: an earlier delivery claimed")
        assert [s.signal for s in kill_request.steps.filter(event="signal_sent")] == ["SIGINT"]
        assert kill_request.steps.filter(event="started").count() == 1
        assert trainer.poll() is None and not checkpoint.exists()  # no SIGTERM: the ladder did not go on

        # Delivered once more after its deadline: refused as expired, the journal unchanged.
        entry = lab.journal().read(kill_request.order_request_id)
        assert entry is not None
        events_before = len(entry.events)
        assert kill_request.start_deadline is not None
        deadline = kill_request.start_deadline
        wait_until("the order's deadline to pass", lambda: timezone.now() > deadline, lab.workers)
        app.send_task(EXECUTE_KILL_ORDER, args=[message], queue=host_queue(lab.name))

        def refused_as_expired() -> bool:
            return AuditEvent.objects.filter(kill_request_id=kill_request.pk,
                                             action="order_refused").exists()

        wait_until("the late delivery to be refused", refused_as_expired, lab.workers)
        refusal = AuditEvent.objects.get(kill_request_id=kill_request.pk, action="order_refused")
        assert refusal.details["reason"] == "expired", refusal.details
        entry = lab.journal().read(kill_request.order_request_id)
        assert entry is not None and len(entry.events) == events_before
        assert trainer.poll() is None and not checkpoint.exists()
    finally:
        _stop(trainer)


@pytest.mark.postgres
def test_postgresql_down_during_ingest_is_retried_and_the_snapshot_stored_once_back(
    start_worker, redis_server: servers.RedisServer, tmp_path: Path, publish_to,
):
    publish_to(redis_server.url)
    url = urlsplit(database_url_for_workers())
    assert url.port is not None
    proxy = TcpProxy(url.port)
    through_proxy = urlunsplit(url._replace(netloc=url.netloc.replace(f":{url.port}", f":{proxy.port}")))
    marker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    lab = Lab(tmp_path, start_worker, redis_server.url)
    write_gpus(lab.gpus_file, {})
    try:
        central = lab.central(DATABASE_URL=through_proxy)
        lab.agent()
        wait_until("the first snapshot", lambda: LatestSnapshot.objects.filter(host__name=lab.name).exists(),
                   lab.workers)

        proxy.down()  # PostgreSQL unreachable for central's worker (this test still reaches it)
        write_gpus(lab.gpus_file, {marker.pid: 5 * GiB})
        app.send_task(PROBE_HOST, queue=host_queue(lab.name), expires=30)
        wait_until("central to fail on the database and retry",
                   lambda: "OperationalError" in central.log and "Retry in" in central.log, lab.workers)
        assert lab.record_of(marker.pid) is None
        # Nothing of the new snapshot was written: no partial rows while the database was away.
        latest = LatestSnapshot.objects.get(host__name=lab.name)
        assert not any(p["pid"] == marker.pid for p in latest.document["processes"])

        proxy.up()
        record = wait_until("the snapshot, ingested once the database is back",
                            lambda: lab.record_of(marker.pid), lab.workers)
        assert isinstance(record, dict) and sum(record["gpu_memory_bytes"].values()) == 5 * GiB
        # The retry was told (gpuadmin/celery.py); the tasks that went well said nothing (settings.LOGGING).
        assert "will run again: Retry in" in central.log
        assert " succeeded in " not in central.log and "] received" not in central.log
    finally:
        proxy.down()
        _stop(marker)

