"""Migration 0016 makes the history tables partitioned by day on PostgreSQL, keeping their rows, and
is undone cleanly (gpuadmin/fleet/history/partitions.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet.history import partitions

BEFORE = ("fleet", "0015_process_life_launcher_and_gpu_health_history")

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = [pytest.mark.django_db(transaction=True, serialized_rollback=True), pytest.mark.postgres]


def _migrate(target: list[tuple[str, str]] | None = None) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())
    return executor


def _samples() -> list[tuple[int, datetime]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, taken_at FROM fleet_hostsample ORDER BY id")
        return [(row[0], row[1]) for row in cursor.fetchall()]


def _primary_key() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE conrelid = 'fleet_hostsample'::regclass AND contype = 'p'")
        return str(cursor.fetchone()[0])


def test_the_history_keeps_its_rows_both_ways_and_is_partitioned_by_day() -> None:
    now = datetime.now(UTC)
    try:
        executor = _migrate([BEFORE])
        assert not partitions.is_partitioned(partitions.HOST_SAMPLES)
        apps = executor.loader.project_state([BEFORE]).apps
        host = apps.get_model("fleet", "Host").objects.create(name="migrated")
        moments = [now - timedelta(days=200), now - timedelta(hours=30), now]
        apps.get_model("fleet", "HostSample").objects.bulk_create([
            apps.get_model("fleet", "HostSample")(host=host, taken_at=moment, process_count=1, zombie_count=0,
                                                  uninterruptible_count=0, pids_in_use=1, pid_max=9)
            for moment in moments
        ])
        before = _samples()
        assert _primary_key() == "PRIMARY KEY (id)"

        _migrate()

        assert all(partitions.is_partitioned(table) for table in partitions.TABLES)
        assert _samples() == before
        assert _primary_key() == "PRIMARY KEY (id, taken_at)"
        # Today's row is in today's partition, the old one in the default partition.
        with connection.cursor() as cursor:
            cursor.execute("SELECT tableoid::regclass::text FROM fleet_hostsample ORDER BY taken_at")
            where = [row[0] for row in cursor.fetchall()]
        assert where[0] == "fleet_hostsample" + partitions.DEFAULT_SUFFIX
        assert where[2] == partitions.HOST_SAMPLES.partition(now.date())
        # New rows are numbered on from the copied ones.
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO fleet_hostsample (host_id, taken_at, process_count, zombie_count, "
                           "uninterruptible_count, pids_in_use, pid_max) VALUES (%s, %s, 1, 0, 0, 1, 9) "
                           "RETURNING id", [host.pk, now])
            assert cursor.fetchone()[0] > before[-1][0]

        _migrate([BEFORE])

        assert not partitions.is_partitioned(partitions.HOST_SAMPLES)
        assert _samples()[:3] == before and _primary_key() == "PRIMARY KEY (id)"
    finally:
        _migrate()
