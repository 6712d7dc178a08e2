"""The coarse tier (retention.roll_up_coarse): 30-minute rollups of the 5-minute ones, which then go after
GPUADMIN_HISTORY_FINE_DAYS; the 30-minute ones stay GPUADMIN_HISTORY_DAYS."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models import Avg, Count, Max, Min

from gpuadmin.fleet.history import partitions, retention
from gpuadmin.fleet.models import (
    Gpu,
    GpuRollup,
    GpuRollupCoarse,
    GpuSample,
    Host,
    HostRollup,
    HostRollupCoarse,
    HostSample,
)

pytestmark = pytest.mark.django_db

MiB = 1024**2
GiB = 1024**3
# A half-hour boundary (Unix seconds divisible by 1800).
T0 = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)
HALF_HOUR = timedelta(minutes=30)


@pytest.fixture
def host() -> Host:
    host = Host.objects.create(name="coarse01", boot_id="b", pid_max=4194304)
    Gpu.objects.create(host=host, uuid="GPU-coarse-0", index=0, memory_total_bytes=80 * GiB)
    Gpu.objects.create(host=host, uuid="GPU-coarse-1", index=1, memory_total_bytes=80 * GiB)
    return host


def raw_half_hour(host: Host, start: datetime) -> None:
    """A sample every 10 s for half an hour: figures that vary within and across the 5-minute buckets
    (not whole MiB, so the rounding shows); GPU 1 says nothing of its utilization or health."""
    rng = random.Random(7)
    gpus = list(host.gpus.order_by("index"))
    gpu_rows, host_rows = [], []
    for step in range(180):
        taken_at = start + timedelta(seconds=10 * step)
        for gpu in gpus:
            said = gpu.index == 0
            gpu_rows.append(
                GpuSample(
                    gpu=gpu,
                    taken_at=taken_at,
                    memory_used_bytes=rng.randrange(GiB, 70 * GiB),
                    memory_attributed_bytes=rng.randrange(0, GiB),
                    utilization_percent=rng.randrange(101) if said else None,
                    temperature_celsius=rng.randrange(30, 90) if said else None,
                    power_draw_milliwatts=rng.randrange(50_000, 700_000) if said else None,
                    power_limit_milliwatts=700_000 - step if said else None,
                )
            )
        host_rows.append(
            HostSample(
                host=host,
                taken_at=taken_at,
                process_count=900,
                zombie_count=rng.randrange(9),
                uninterruptible_count=rng.randrange(3),
                pids_in_use=1000 + rng.randrange(500),
                pid_max=4194304,
            )
        )
    GpuSample.objects.bulk_create(gpu_rows)
    HostSample.objects.bulk_create(host_rows)


def test_coarse_rollups_equal_a_direct_computation_over_the_raw_samples(host: Host) -> None:
    raw_half_hour(host, T0)
    retention.roll_up(T0 + HALF_HOUR + timedelta(minutes=1))
    assert retention.roll_up_coarse(T0 + HALF_HOUR + timedelta(minutes=1)) == 1

    direct = {
        row["gpu__index"]: row
        for row in GpuSample.objects.filter(gpu__host=host)
        .values("gpu__index")
        .annotate(
            n=Count("id"),
            used_min=Min("memory_used_bytes"),
            used_mean=Avg("memory_used_bytes"),
            used_max=Max("memory_used_bytes"),
            attributed_min=Min("memory_attributed_bytes"),
            attributed_mean=Avg("memory_attributed_bytes"),
            attributed_max=Max("memory_attributed_bytes"),
            util_min=Min("utilization_percent"),
            util_mean=Avg("utilization_percent"),
            util_max=Max("utilization_percent"),
            temperature_mean=Avg("temperature_celsius"),
            temperature_max=Max("temperature_celsius"),
            power_mean=Avg("power_draw_milliwatts"),
            power_max=Max("power_draw_milliwatts"),
            limit_max=Max("power_limit_milliwatts"),
        )
    }
    coarse = {r.gpu.index: r for r in GpuRollupCoarse.objects.select_related("gpu")}
    assert coarse.keys() == {0, 1}
    for index, row in direct.items():
        rollup = coarse[index]
        assert rollup.bucket == retention.coarse_bucket_of(T0)
        assert (rollup.sample_count, rollup.fine_bucket_count) == (row["n"], 6) == (180, 6)
        # Min rounded down, max up, exactly as over the raw samples: no peak hidden.
        assert (rollup.memory_used_min_mib, rollup.memory_used_max_mib) == (
            row["used_min"] // MiB,
            -(-row["used_max"] // MiB),
        )
        assert (rollup.memory_attributed_min_mib, rollup.memory_attributed_max_mib) == (
            row["attributed_min"] // MiB,
            -(-row["attributed_max"] // MiB),
        )
        assert (rollup.utilization_min_percent, rollup.utilization_max_percent) == (
            row["util_min"],
            row["util_max"],
        )
        assert (
            rollup.temperature_max_celsius,
            rollup.power_draw_max_milliwatts,
            rollup.power_limit_max_milliwatts,
        ) == (row["temperature_max"], row["power_max"], row["limit_max"])
        # Means over time (each 5-minute bucket holds 30 evenly spaced samples, so the same as over the
        # samples), within the one unit the 5-minute tier's rounding may add.
        assert abs(rollup.memory_used_mean_mib - row["used_mean"] / MiB) <= 1
        assert abs(rollup.memory_attributed_mean_mib - row["attributed_mean"] / MiB) <= 1
        if index == 1:  # said nothing: null, never zero
            assert (
                rollup.utilization_mean_tenths_percent,
                rollup.temperature_mean_celsius,
                rollup.power_draw_mean_milliwatts,
                rollup.temperature_max_celsius,
            ) == (None,) * 4
            continue
        assert abs(rollup.utilization_mean_tenths_percent - row["util_mean"] * 10) <= 1
        assert abs(rollup.temperature_mean_celsius - row["temperature_mean"]) <= 1
        assert abs(rollup.power_draw_mean_milliwatts - row["power_mean"]) <= 1
    # The host's means are floats in both tiers: equal to the raw samples' mean.
    host_direct = HostSample.objects.aggregate(
        n=Count("id"),
        z_min=Min("zombie_count"),
        z_mean=Avg("zombie_count"),
        z_max=Max("zombie_count"),
        d_mean=Avg("uninterruptible_count"),
        p_min=Min("pids_in_use"),
        p_mean=Avg("pids_in_use"),
        p_max=Max("pids_in_use"),
    )
    host_rollup = HostRollupCoarse.objects.get()
    assert (
        host_rollup.sample_count,
        host_rollup.zombies_min,
        host_rollup.zombies_max,
        host_rollup.pids_in_use_min,
        host_rollup.pids_in_use_max,
        host_rollup.pid_max,
    ) == (
        host_direct["n"],
        host_direct["z_min"],
        host_direct["z_max"],
        host_direct["p_min"],
        host_direct["p_max"],
        4194304,
    )
    assert (host_rollup.zombies_mean, host_rollup.d_state_mean, host_rollup.pids_in_use_mean) == (
        pytest.approx(host_direct["z_mean"]),
        pytest.approx(host_direct["d_mean"]),
        pytest.approx(host_direct["p_mean"]),
    )


def fine(
    host: Host,
    bucket: int,
    *,
    samples: int = 30,
    utilization: int | None = 500,
    used: int = 1024,
    zombies: float = 0.0,
) -> None:
    """One 5-minute rollup of each GPU and of the host in ``bucket``."""
    for gpu in host.gpus.all():
        GpuRollup.objects.create(
            gpu=gpu,
            bucket=bucket,
            sample_count=samples,
            memory_used_min_mib=used,
            memory_used_mean_mib=used,
            memory_used_max_mib=used,
            memory_attributed_min_mib=0,
            memory_attributed_mean_mib=0,
            memory_attributed_max_mib=0,
            utilization_min_percent=0,
            utilization_mean_tenths_percent=utilization,
            utilization_max_percent=100,
        )
    HostRollup.objects.create(
        host=host,
        bucket=bucket,
        sample_count=samples,
        zombies_min=0,
        zombies_mean=zombies,
        zombies_max=9,
        d_state_min=0,
        d_state_mean=0,
        d_state_max=0,
        pids_in_use_min=1,
        pids_in_use_mean=1,
        pids_in_use_max=1,
        pid_max=10,
    )


def test_a_mean_weighs_each_five_minutes_the_same_whatever_its_sample_count(host: Host) -> None:
    """Span, not samples: a steady host sends fewer samples, and its quiet minutes count as long."""
    first = retention.bucket_of(T0)
    fine(host, first, samples=30, utilization=100, zombies=1.0)
    fine(host, first + 1, samples=3, utilization=700, zombies=4.0)
    fine(host, first + 2, samples=30, utilization=None)  # said nothing: out of the mean
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + HALF_HOUR)

    assert retention.roll_up_coarse(T0 + HALF_HOUR) == 1

    rollup = GpuRollupCoarse.objects.filter(gpu__index=0).get()
    assert rollup.utilization_mean_tenths_percent == 400  # not (30 x 100 + 3 x 700) / 33 = 155
    assert (rollup.sample_count, rollup.fine_bucket_count) == (63, 3)
    host_rollup = HostRollupCoarse.objects.get()
    assert host_rollup.zombies_mean == pytest.approx((1.0 + 4.0 + 0.0) / 3)


def test_a_half_hour_is_rolled_up_once_the_five_minute_tier_is_past_it(host: Host) -> None:
    first = retention.bucket_of(T0)
    for bucket in range(first, first + 6):
        fine(host, bucket)
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + timedelta(minutes=25))
    now = T0 + timedelta(minutes=26)
    assert retention.roll_up_coarse(now) == 0
    assert not GpuRollupCoarse.objects.exists()

    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + HALF_HOUR)
    assert retention.roll_up_coarse(now) == 1
    assert Host.objects.get().history_coarse_rolled_up_until == T0 + HALF_HOUR
    assert retention.roll_up_coarse(now) == 0  # once


def test_catching_up_after_downtime_is_bounded_per_run(
    host: Host, django_assert_max_num_queries: Any
) -> None:
    """Three days of 5-minute rollups waiting: a day of half hours per run at most, on from where it
    stopped."""
    first = retention.bucket_of(T0)
    for bucket in range(first, first + 3 * 288, 3):  # a 5-minute rollup every 15 minutes
        fine(host, bucket)
    end = T0 + timedelta(days=3)
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=end)

    runs = []
    while written := retention.roll_up_coarse(end, max_buckets=retention.MAX_COARSE_BUCKETS_PER_HOST_PER_RUN):
        runs.append(written)
        assert Host.objects.get().history_coarse_rolled_up_until == T0 + timedelta(days=len(runs))
    assert runs == [48, 48, 48]
    assert GpuRollupCoarse.objects.count() == 2 * 144
    assert set(GpuRollupCoarse.objects.values_list("fine_bucket_count", flat=True)) == {2}
    # A host with nothing closed since costs no query.
    with django_assert_max_num_queries(1):
        assert retention.roll_up_coarse(end) == 0


def test_five_minute_rollups_go_after_the_fine_days_once_in_the_coarse_tier(
    host: Host, settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_FINE_DAYS = 2
    settings.GPUADMIN_HISTORY_DAYS = 90
    first = retention.bucket_of(T0)
    for bucket in range(first, first + 12):
        fine(host, bucket)
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + timedelta(hours=1))
    later = T0 + timedelta(days=3)

    # Not in the coarse tier yet: old as they are, they stay.
    pruned = retention.prune(later)
    assert (pruned.gpu_rollups, pruned.host_rollups) == (0, 0)

    result = retention.maintain_history(later)
    assert result.coarse_buckets_rolled_up == 2
    assert (result.pruned.gpu_rollups, result.pruned.host_rollups) == (24, 12)
    assert not GpuRollup.objects.exists() and not HostRollup.objects.exists()
    assert GpuRollupCoarse.objects.count() == 4 and HostRollupCoarse.objects.count() == 2

    pruned = retention.prune(T0 + timedelta(days=90, hours=1))
    assert (pruned.gpu_rollups_coarse, pruned.host_rollups_coarse) == (4, 2)
    assert not GpuRollupCoarse.objects.exists()


def test_the_weekly_digest_counts_five_minute_buckets_in_either_tier(host: Host, settings: Any) -> None:
    """Offline time over a week (usage/digest.py) reads the 30-minute tier where the 5-minute one is gone."""
    first = retention.bucket_of(T0)
    present = [*range(first, first + 5), *range(first + 12, first + 18), first + 20]
    for bucket in present:
        fine(host, bucket)
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + timedelta(hours=2))
    retention.roll_up_coarse(T0 + timedelta(hours=2))
    host.refresh_from_db()
    assert host.history_coarse_rolled_up_until == T0 + timedelta(hours=2)
    settings.GPUADMIN_HISTORY_FINE_DAYS = 0
    retention.prune(T0 + timedelta(hours=2))
    assert not HostRollup.objects.exists()

    assert retention.five_minute_buckets_with_samples(host, first, first + 24) == len(present)
    fine(host, first + 24)  # after the coarse mark: read from the 5-minute tier
    assert retention.five_minute_buckets_with_samples(host, first, first + 25) == len(present) + 1


def test_the_coarse_tables_have_the_fine_ones_columns_and_one_more() -> None:
    def columns(model: Any) -> list[tuple[str, str, bool]]:
        return [(f.name, f.get_internal_type(), f.null) for f in model._meta.concrete_fields]

    assert [c for c in columns(GpuRollupCoarse) if c[0] != "fine_bucket_count"] == columns(GpuRollup)
    assert [c for c in columns(HostRollupCoarse) if c[0] != "fine_bucket_count"] == columns(HostRollup)
    # partitions.py cannot import retention (retention imports it): its copies of the bucket sizes agree.
    assert (partitions.BUCKET_SECONDS, partitions.COARSE_BUCKET_SECONDS) == (
        retention.BUCKET_SECONDS, retention.COARSE_BUCKET_SECONDS)


def test_a_host_behind_in_the_coarse_tier_keeps_its_five_minute_rollups_past_its_mark(
    host: Host, settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_FINE_DAYS = 2
    behind = Host.objects.create(name="coarse02")
    Gpu.objects.create(host=behind, uuid="GPU-coarse-2", index=0)
    first = retention.bucket_of(T0)
    for owner in (host, behind):
        for bucket in (first, first + 12):  # 12:00 and 13:00, both past the fine keep
            fine(owner, bucket)
    Host.objects.filter(pk=host.pk).update(history_coarse_rolled_up_until=T0 + timedelta(days=1))
    Host.objects.filter(pk=behind.pk).update(history_coarse_rolled_up_until=T0 + HALF_HOUR)

    pruned = retention.prune(T0 + timedelta(days=3))

    assert (pruned.gpu_rollups, pruned.host_rollups) == (4 + 1, 2 + 1)  # 2 GPUs x 2 buckets + 1
    assert list(HostRollup.objects.values_list("host__name", "bucket")) == [("coarse02", first + 12)]


def test_a_host_without_five_minute_rollups_is_marked_rolled_up_and_costs_no_query_after(
    host: Host, django_assert_max_num_queries: Any
) -> None:
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=T0 + timedelta(hours=1))
    assert retention.roll_up_coarse(T0 + timedelta(hours=1)) == 0
    assert Host.objects.get().history_coarse_rolled_up_until == T0 + timedelta(hours=1)
    with django_assert_max_num_queries(1):
        assert retention.roll_up_coarse(T0 + timedelta(hours=1)) == 0
