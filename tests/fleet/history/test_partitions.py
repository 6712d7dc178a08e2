"""History partitioned by day (gpuadmin/fleet/history/partitions.py): on PostgreSQL the history tables
are partitioned by migration 0016, the maintenance beat creates days ahead and retention drops a past
day's partition whole; on SQLite the same models are plain tables and rows are deleted as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from gpuadmin.fleet.history import partitions, retention
from gpuadmin.fleet.models import (
    Gpu,
    GpuRollup,
    GpuRollupCoarse,
    GpuSample,
    Host,
    HostRollup,
    HostSample,
    ProcessLife,
    ProcessPoint,
)

pytestmark = pytest.mark.django_db

# Far from the day the test database was made (its migration made partitions around that day).
NOW = datetime(2031, 6, 15, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=100)  # past every keeping time (raw 2 days, the rest 90)
RECENT = NOW - timedelta(hours=1)


def exists(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return bool(cursor.fetchone()[0])


def history_at(host: Host, gpu: Gpu, life: ProcessLife, moment: datetime) -> None:
    """One row of each history table at ``moment``."""
    bucket = retention.bucket_of(moment)
    GpuSample.objects.create(gpu=gpu, taken_at=moment, memory_used_bytes=1, utilization_percent=1)
    HostSample.objects.create(host=host, taken_at=moment, process_count=1, zombie_count=0,
                              uninterruptible_count=0, pids_in_use=1, pid_max=10)
    ProcessPoint.objects.create(life=life, taken_at=moment, gpu_memory_bytes=1, state="R")
    GpuRollup.objects.create(gpu=gpu, bucket=bucket, sample_count=1, memory_attributed_min_mib=0,
                             memory_attributed_mean_mib=0, memory_attributed_max_mib=0)
    HostRollup.objects.create(host=host, bucket=bucket, sample_count=1, zombies_min=0, zombies_mean=0,
                              zombies_max=0, d_state_min=0, d_state_mean=0, d_state_max=0, pids_in_use_min=1,
                              pids_in_use_mean=1, pids_in_use_max=1, pid_max=10)


@pytest.fixture
def fleet_history() -> tuple[Host, Gpu, ProcessLife]:
    host = Host.objects.create(name="part01", history_rolled_up_until=NOW)
    gpu = Gpu.objects.create(host=host, uuid="GPU-part-0", index=0)
    life = ProcessLife.objects.create(host=host, boot_id="b", pid=7, start_time_ticks=1, first_seen_at=OLD,
                                      last_seen_at=NOW)
    if connection.vendor == "postgresql":
        partitions.ensure_partitions(OLD)
        partitions.ensure_partitions(NOW)
    history_at(host, gpu, life, OLD)
    history_at(host, gpu, life, RECENT)
    return host, gpu, life


def counts() -> list[int]:
    return [model.objects.count() for model in (GpuSample, HostSample, ProcessPoint, GpuRollup, HostRollup)]


@pytest.mark.postgres
def test_the_beat_creates_each_tables_partitions_ahead() -> None:
    created = retention.maintain_history(NOW).partitions_created

    days = [NOW.date() + timedelta(days=n) for n in range(-1, partitions.AHEAD_DAYS + 1)]
    assert created == len(days) * len(partitions.TABLES)
    for table in partitions.TABLES:
        assert partitions.is_partitioned(table)
        assert set(days) <= set(partitions.partition_days(table))
        assert exists(table.table + partitions.DEFAULT_SUFFIX)
    assert partitions.ensure_partitions(NOW) == 0  # once


@pytest.mark.postgres
def test_rows_go_to_their_days_partition(fleet_history) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM fleet_hostsample ORDER BY taken_at")
        assert [row[0] for row in cursor.fetchall()] == [partitions.HOST_SAMPLES.partition(OLD.date()),
                                                          partitions.HOST_SAMPLES.partition(RECENT.date())]
        cursor.execute("SELECT tableoid::regclass::text FROM fleet_gpurollup ORDER BY bucket")
        assert [row[0] for row in cursor.fetchall()] == [partitions.GPU_ROLLUPS.partition(OLD.date()),
                                                          partitions.GPU_ROLLUPS.partition(RECENT.date())]


@pytest.mark.postgres
def test_retention_drops_a_past_days_partition_whole_and_keeps_newer_ones(fleet_history) -> None:
    result = retention.maintain_history(NOW)

    old_partitions = [table.partition(OLD.date()) for table in partitions.TABLES]
    assert set(old_partitions) <= set(result.partitions_dropped)  # with the empty days around it
    assert not any(exists(name) for name in old_partitions)
    assert result.pruned.total == 0  # nothing left for the delete path
    assert counts() == [1, 1, 1, 1, 1]
    assert GpuSample.objects.get().taken_at == RECENT
    assert HostRollup.objects.get().bucket == retention.bucket_of(RECENT)
    assert all(exists(table.partition(RECENT.date())) for table in partitions.TABLES)


@pytest.mark.postgres
def test_raw_samples_not_rolled_up_keep_their_partition(fleet_history) -> None:
    host, _, _ = fleet_history
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=OLD)  # behind its old samples

    dropped = retention.drop_expired_partitions(NOW)

    raw = [partitions.GPU_SAMPLES.partition(OLD.date()), partitions.HOST_SAMPLES.partition(OLD.date())]
    assert not set(raw) & set(dropped) and all(exists(name) for name in raw)
    assert partitions.GPU_ROLLUPS.partition(OLD.date()) in dropped
    assert GpuSample.objects.count() == HostSample.objects.count() == 2


def test_sqlite_keeps_plain_tables_and_deletes_rows(fleet_history) -> None:
    """The same models and retention on either engine: past rows go, newer ones stay."""
    result = retention.maintain_history(NOW)

    assert counts() == [1, 1, 1, 1, 1]
    if connection.vendor == "sqlite":
        assert not any(partitions.is_partitioned(table) for table in partitions.TABLES)
        assert (result.partitions_created, result.partitions_dropped) == (0, ())
        assert result.pruned.total == 5


@pytest.mark.postgres
def test_five_minute_partitions_go_after_the_fine_days_once_rolled_up(fleet_history, settings) -> None:
    host, gpu, _ = fleet_history
    settings.GPUADMIN_HISTORY_FINE_DAYS = 2
    three_days_ago, yesterday = NOW - timedelta(days=3), NOW - timedelta(days=1)
    partitions.ensure_partitions(three_days_ago)
    for moment in (three_days_ago, yesterday):
        bucket = retention.bucket_of(moment)
        GpuRollup.objects.create(gpu=gpu, bucket=bucket, sample_count=1, memory_attributed_min_mib=0,
                                 memory_attributed_mean_mib=0, memory_attributed_max_mib=0)
        HostRollup.objects.create(host=host, bucket=bucket, sample_count=1, zombies_min=0, zombies_mean=0,
                                  zombies_max=0, d_state_min=0, d_state_mean=0, d_state_max=0,
                                  pids_in_use_min=1, pids_in_use_mean=1, pids_in_use_max=1, pid_max=10)
    fine = [partitions.GPU_ROLLUPS.partition(three_days_ago.date()),
            partitions.HOST_ROLLUPS.partition(three_days_ago.date())]

    # Not in the 30-minute tier yet: kept, old as it is.
    dropped = retention.drop_expired_partitions(NOW)
    assert not set(fine) & set(dropped) and all(exists(name) for name in fine)

    for _ in range(92):  # a day of half hours per run, from GPUADMIN_HISTORY_DAYS ago
        retention.roll_up_coarse(NOW)
    assert Host.objects.get().history_coarse_rolled_up_until == NOW
    assert GpuRollupCoarse.objects.filter(bucket=retention.coarse_bucket_of(three_days_ago)).exists()
    dropped = retention.drop_expired_partitions(NOW)

    assert set(fine) <= set(dropped) and not any(exists(name) for name in fine)
    assert exists(partitions.GPU_ROLLUPS.partition(yesterday.date()))  # within the fine days
    assert exists(partitions.GPU_ROLLUPS_COARSE.partition(three_days_ago.date()))
    assert GpuRollupCoarse.objects.filter(bucket=retention.coarse_bucket_of(three_days_ago)).exists()
    assert retention.prune(NOW).gpu_rollups == 0  # nothing left for the delete path
