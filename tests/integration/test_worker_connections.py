"""A central worker keeps its PostgreSQL connection from one task to the next (gpuadmin/celery.py).

Celery's Django fixup closes the connection around every task unless told
otherwise; each snapshot then started a PostgreSQL server process of its own.
The test watches the worker's sessions in pg_stat_activity while it stores
three snapshots no host signed (each a row in the rejection log: a write). The worker names its
sessions (application_name) so that sessions other tests left on the same database (a thread's
connection not yet collected) are not counted as the worker's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from kombu import Connection

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.fleet.models import SnapshotRejection
from gpuadmin.wire.task_names import INGEST_SNAPSHOT
from tests.integration.helpers import Worker, database_url_for_workers, wait_until
from tests.services import RedisServer

pytestmark = [pytest.mark.services, pytest.mark.postgres,
              pytest.mark.django_db(transaction=True, serialized_rollback=True)]


WORKER_APPLICATION = "gpuadmin-test-central-worker"


def worker_sessions() -> dict[int, str]:
    """The worker's sessions on this test's database, by server process id, with their state."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, state FROM pg_stat_activity "
                       "WHERE datname = current_database() AND application_name = %s", [WORKER_APPLICATION])
        return dict(cursor.fetchall())


def test_a_central_worker_keeps_its_database_connection_from_one_task_to_the_next(
    start_worker: Callable[..., Worker], redis_server: RedisServer,
) -> None:
    named_sessions = f"{database_url_for_workers()}?application_name={WORKER_APPLICATION}"
    central = start_worker("central", CENTRAL_QUEUE, DATABASE_URL=named_sessions,
                           GPUADMIN_HOST_NAME="central-connections")

    def ingest(count: int) -> None:
        with Connection(redis_server.url) as broker:
            for number in range(count):
                app.send_task(INGEST_SNAPSHOT, args=[f"not a signed snapshot {number}"], connection=broker)

    def settled(rejections: int) -> list[dict[int, str]] | None:
        """[the worker's sessions] once it stored `rejections` and went idle; None before."""
        sessions = worker_sessions()
        if SnapshotRejection.objects.count() == rejections and all(s == "idle" for s in sessions.values()):
            return [sessions]
        return None

    ingest(1)
    [first] = wait_until("the first rejection stored", lambda: settled(1), [central])
    ingest(2)
    [later] = wait_until("three rejections stored", lambda: settled(3), [central])
    # One session, the same server process throughout (closed around each task, there would be none
    # left once idle, and a new process for every task).
    assert len(first) == 1, first
    assert later == first
