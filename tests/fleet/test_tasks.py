"""The fleet's Celery tasks: ingest (rejections are final, database errors retry) and probe scheduling.

Probes are captured at ``app.send_task`` (the broker is not under test here;
tests/integration runs real workers), plus one real kombu message through the
in-memory transport to see ``expires`` land in the message itself.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError
from django.test import override_settings
from kombu import Connection

from gpuadmin.celery import app
from gpuadmin.fleet import tasks
from gpuadmin.fleet.models import Host, SnapshotRejection
from gpuadmin.fleet.tasks import (
    INGEST_MAX_RETRIES,
    PROBE_TASK,
    ingest_snapshot_task,
    request_probe,
    schedule_probes,
    send_due_probes,
)
from tests.factories import proc, snapshot
from tests.fleet.conftest import T0, at

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every task central sends, as {name, queue, expires}, instead of reaching a broker."""
    calls: list[dict[str, Any]] = []

    def send_task(name: str, *args: Any, **options: Any) -> None:
        calls.append({"name": name, "args": args, **options})

    monkeypatch.setattr(app, "send_task", send_task)
    return calls


def host_last_seen(name: str, last_seen_at: datetime) -> Host:
    return Host.objects.create(
        name=name, first_seen_at=last_seen_at - timedelta(days=1), last_seen_at=last_seen_at
    )


def probed(calls: list[dict[str, Any]]) -> list[str]:
    return sorted(c["queue"] for c in calls)


def test_every_host_gets_a_probe_on_its_own_queue_that_expires_after_one_interval(
    sent: list[dict[str, Any]],
) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("gpu02", at(-30 * 60))  # offline half an hour: still every interval
    with override_settings(GPUADMIN_PROBE_INTERVAL_SECONDS=7):
        assert send_due_probes(at(0)) == ["gpu01", "gpu02"]
    assert probed(sent) == ["host.gpu01", "host.gpu02"]
    assert all(c["name"] == PROBE_TASK and c["expires"] == 7 for c in sent)
    assert set(Host.objects.values_list("last_probe_sent_at", flat=True)) == {at(0)}


def test_hosts_offline_for_over_an_hour_are_probed_once_a_minute(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-5))
    host_last_seen("dead", at(-2 * 3600))
    interval = settings.GPUADMIN_PROBE_INTERVAL_SECONDS
    per_tick = []
    for tick in range(13):  # two minutes of beat ticks
        sent.clear()
        send_due_probes(at(tick * interval))
        per_tick.append(probed(sent))
    dead_ticks = [i for i, queues in enumerate(per_tick) if "host.dead" in queues]
    assert dead_ticks == [0, 60 // interval, 120 // interval]
    assert all("host.gpu01" in queues for queues in per_tick)
    assert all(c["expires"] == interval for c in sent)


def test_schedule_probes_task_sends_and_counts(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", datetime.now(T0.tzinfo))
    assert schedule_probes.apply().get() == 1
    assert probed(sent) == ["host.gpu01"]
    assert schedule_probes.queue == "central"


def test_request_probe_sends_one_expiring_probe(sent: list[dict[str, Any]]) -> None:
    host_last_seen("gpu01", at(-7200))
    request_probe("gpu01", now=at(0))
    assert sent == [
        {
            "name": PROBE_TASK,
            "args": (),
            "queue": "host.gpu01",
            "expires": settings.GPUADMIN_PROBE_INTERVAL_SECONDS,
        }
    ]
    assert Host.objects.get().last_probe_sent_at == at(0)


def test_the_probe_message_itself_carries_the_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    original = app.send_task
    with Connection("memory://") as connection:
        monkeypatch.setattr(app, "send_task", lambda *a, **kw: original(*a, connection=connection, **kw))
        before = datetime.now(T0.tzinfo)
        request_probe("gpu-mem")
        with connection.SimpleQueue("host.gpu-mem") as queue:
            message = queue.get(timeout=2)
            message.ack()
    assert message.headers["task"] == PROBE_TASK
    expires = datetime.fromisoformat(message.headers["expires"])
    interval = timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
    assert before + interval - timedelta(seconds=1) <= expires <= datetime.now(T0.tzinfo) + interval


def test_ingest_task_stores_a_good_snapshot() -> None:
    text = json.dumps(snapshot("gpu01", processes=[proc(10)]))
    assert ingest_snapshot_task.apply(args=[text]).get() == "gpu01"
    assert Host.objects.filter(name="gpu01").exists()


def test_ingest_task_does_not_retry_a_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_retry(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a rejected snapshot must not be retried")

    monkeypatch.setattr(ingest_snapshot_task, "retry", no_retry)
    result = ingest_snapshot_task.apply(args=['{"schema_version": 1, "host": {"name": "gpu01"'])
    assert result.successful()
    assert result.get() is None
    assert SnapshotRejection.objects.get().host_name == "gpu01"


def test_ingest_task_retries_database_errors_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    # The database is not what is under test here: the task's retry policy is.
    attempts: list[str] = []

    def database_down(payload: str) -> Host:
        attempts.append(payload)
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(tasks, "ingest_snapshot", database_down)
    result = ingest_snapshot_task.apply(args=["{}"])
    assert result.failed()
    assert isinstance(result.result, OperationalError)
    assert len(attempts) == INGEST_MAX_RETRIES + 1
    assert ingest_snapshot_task.retry_backoff
    assert ingest_snapshot_task.queue == "central"
