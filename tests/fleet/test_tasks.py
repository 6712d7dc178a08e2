"""The fleet's Celery tasks: ingest (rejections are final, database errors retry) and history's upkeep.

The tasks are thin; what they call is tested on its own (test_ingest.py,
test_probes.py). Here: their names, queues and retry policies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import OperationalError

from gpuadmin.fleet import tasks
from gpuadmin.fleet.models import Host, LatestSnapshot, SnapshotRejection
from gpuadmin.fleet.tasks import INGEST_MAX_RETRIES, ingest_snapshot_task
from tests.factories import proc, snapshot
from tests.keys import accept, signed_snapshot

pytestmark = pytest.mark.django_db


def test_ingest_task_stores_a_good_snapshot_signed_by_the_hosts_accepted_key() -> None:
    accept("gpu01")
    message = signed_snapshot(snapshot("gpu01", processes=[proc(10)]))
    assert ingest_snapshot_task.apply(args=[message]).get() == "gpu01"
    assert Host.objects.get(name="gpu01").latest_snapshot


def test_ingest_task_stores_nothing_unsigned() -> None:
    accept("gpu01")
    text = json.dumps(snapshot("gpu01", processes=[proc(10)]))
    assert ingest_snapshot_task.apply(args=[text]).get() is None
    assert not LatestSnapshot.objects.exists()
    assert Host.objects.get(name="gpu01").rejected_message_count == 1


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

    monkeypatch.setattr(tasks, "receive_snapshot", database_down)
    result = ingest_snapshot_task.apply(args=["{}"])
    assert result.failed()
    assert isinstance(result.result, OperationalError)
    assert len(attempts) == INGEST_MAX_RETRIES + 1
    assert ingest_snapshot_task.retry_backoff
    assert ingest_snapshot_task.queue == "central"
