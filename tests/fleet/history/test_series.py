"""Chart series (gpuadmin/fleet/history/series.py): each range reads its tier, and what is not in that
tier yet is summarised on the fly, with the same shapes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.fleet.history import retention, series
from gpuadmin.fleet.models import Gpu, GpuRollup, GpuRollupCoarse, GpuSample, Host, HostSample

pytestmark = pytest.mark.django_db

MiB = 1024**2
NOW = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)  # a 2-hour boundary
COARSE_MARK = NOW - timedelta(hours=2)  # 10:00: the 30-minute tier holds what is before
FINE_MARK = NOW - timedelta(minutes=10)  # 11:50: the 5-minute tier holds what is before


def gpu_rollup(
    model: type[GpuRollup] | type[GpuRollupCoarse],
    gpu: Gpu,
    bucket: int,
    used_mib: int,
    utilization_tenths: int,
    **extra: int,
) -> None:
    model.objects.create(
        gpu=gpu,
        bucket=bucket,
        sample_count=30,
        memory_used_min_mib=used_mib,
        memory_used_mean_mib=used_mib,
        memory_used_max_mib=used_mib,
        memory_attributed_min_mib=0,
        memory_attributed_mean_mib=0,
        memory_attributed_max_mib=0,
        utilization_min_percent=0,
        utilization_mean_tenths_percent=utilization_tenths,
        utilization_max_percent=100,
        **extra,
    )


@pytest.fixture
def host() -> Host:
    """30-minute rollups at 09:00 and 09:30 (111 MiB), the 5-minute ones they summarise still there
    (999 MiB, so a chart reading them shows it), a 5-minute rollup at 10:00 (222 MiB) not in the 30-minute
    tier yet, and a raw sample at 11:55 (333 MiB) not rolled up yet."""
    host = Host.objects.create(
        name="series01", history_rolled_up_until=FINE_MARK, history_coarse_rolled_up_until=COARSE_MARK
    )
    gpu = Gpu.objects.create(host=host, uuid="GPU-series-0", index=0, present=True)
    nine = retention.coarse_bucket_of(COARSE_MARK - timedelta(hours=1))
    gpu_rollup(GpuRollupCoarse, gpu, nine, 111, 200, fine_bucket_count=6)
    gpu_rollup(GpuRollupCoarse, gpu, nine + 1, 111, 500, fine_bucket_count=2)
    for bucket in range(nine * 6, nine * 6 + 12):
        gpu_rollup(GpuRollup, gpu, bucket, 999, 900)
    gpu_rollup(GpuRollup, gpu, retention.bucket_of(COARSE_MARK), 222, 100)
    GpuSample.objects.create(
        gpu=gpu, taken_at=NOW - timedelta(minutes=5), memory_used_bytes=333 * MiB, utilization_percent=70
    )
    return host


def points(host: Host, range_name: str) -> list[tuple[str, int, float]]:
    body = series.host_history(host, series.RANGES[range_name], NOW)
    return [
        (p["t"][11:16], p["memory_used_bytes"] // MiB, p["utilization_percent"])
        for p in body["gpus"][0]["points"]
    ]


def test_seven_days_read_the_30_minute_tier_one_row_a_point(host: Host) -> None:
    assert series.host_history(host, series.RANGES["7d"], NOW)["resolution_seconds"] == 1800
    assert points(host, "7d") == [
        ("09:00", 111, 20.0),
        ("09:30", 111, 50.0),
        ("10:00", 222, 10.0),  # a 5-minute rollup not in the 30-minute tier yet
        ("11:30", 333, 70.0),  # a raw sample not rolled up yet
    ]


def test_thirty_days_group_four_30_minute_rows_a_point_weighed_by_their_span(host: Host) -> None:
    assert series.host_history(host, series.RANGES["30d"], NOW)["resolution_seconds"] == 7200
    # 08:00-10:00: 20% over six 5-minute buckets and 50% over two; 10:00-12:00: the highest memory, and
    # the mean of a 5-minute rollup's 10% and the raw sample's bucket's 70%.
    assert points(host, "30d") == [("08:00", 111, 27.5), ("10:00", 333, 40.0)]


def test_a_day_reads_the_5_minute_tier(host: Host) -> None:
    day = points(host, "24h")
    assert day[0] == ("09:00", 999, 90.0) and len(day) == 14


def test_a_coarse_mean_at_its_column_bound_is_charted(host: Host) -> None:
    """A host may claim any utilization: its clamped mean x 6 must not overflow the database's sum."""
    GpuRollupCoarse.objects.update(utilization_mean_tenths_percent=32767)
    assert points(host, "7d")[0] == ("09:00", 111, 3276.7)


def steady_host(*, last_seen_at: datetime) -> Host:
    """A host whose raw samples are change-coded: the GPU's and the host's last written ones 50 s before
    its latest snapshot (NOW - 5 s), which moved nothing past its step."""
    latest, sampled = NOW - timedelta(seconds=5), NOW - timedelta(seconds=55)
    host = Host.objects.create(
        name="steady01", last_seen_at=last_seen_at, last_snapshot_taken_at=latest, pids_in_use=1450,
        pid_max=4194304, zombie_count=2, sampled_at=sampled, sampled_zombie_count=2,
        sampled_uninterruptible_count=0, sampled_pids_in_use=1400, sampled_pid_max=4194304,
    )
    gpu = Gpu.objects.create(
        host=host, uuid="GPU-steady-0", index=0, present=True, memory_used_bytes=42 * MiB,
        memory_attributed_bytes=40 * MiB, utilization_percent=93, sampled_at=sampled,
        sampled_memory_used_bytes=41 * MiB, sampled_memory_attributed_bytes=40 * MiB,
        sampled_utilization_percent=90, sampled_temperature_celsius=70, sampled_power_draw_milliwatts=500_000,
        sampled_power_limit_milliwatts=700_000,
    )
    GpuSample.objects.create(gpu=gpu, taken_at=sampled, memory_used_bytes=41 * MiB,
                             memory_attributed_bytes=40 * MiB, utilization_percent=90, temperature_celsius=70,
                             power_draw_milliwatts=500_000, power_limit_milliwatts=700_000)
    HostSample.objects.create(host=host, taken_at=sampled, process_count=900, zombie_count=2,
                              uninterruptible_count=0, pids_in_use=1400, pid_max=4194304)
    return host


def test_the_last_hour_of_an_online_host_reaches_its_latest_snapshot_with_its_current_figures() -> None:
    body = series.host_history(steady_host(last_seen_at=NOW - timedelta(seconds=4)), series.RANGES["1h"], NOW)
    gpu_points = body["gpus"][0]["points"]
    assert [p["t"] for p in gpu_points] == ["2031-03-10T11:59:05Z", "2031-03-10T11:59:55Z"]
    assert gpu_points[-1] == {
        "t": "2031-03-10T11:59:55Z", "memory_used_bytes": 42 * MiB, "memory_attributed_bytes": 40 * MiB,
        "utilization_percent": 93, "temperature_celsius": 70, "power_draw_milliwatts": 500_000,
        "power_limit_milliwatts": 700_000,
    }
    assert body["host"]["points"][-1] == {"t": "2031-03-10T11:59:55Z", "zombies": 2, "d_state": 0,
                                          "pids_in_use": 1450, "pid_max": 4194304}


def test_an_offline_hosts_last_hour_ends_at_its_last_sample() -> None:
    body = series.host_history(steady_host(last_seen_at=NOW - timedelta(hours=1)), series.RANGES["1h"], NOW)
    assert [p["t"] for p in body["gpus"][0]["points"]] == ["2031-03-10T11:59:05Z"]
    assert [p["t"] for p in body["host"]["points"]] == ["2031-03-10T11:59:05Z"]


def test_a_sample_of_the_latest_snapshot_is_not_repeated(host: Host) -> None:
    five_minutes_ago = NOW - timedelta(minutes=5)
    Host.objects.filter(pk=host.pk).update(last_seen_at=NOW, last_snapshot_taken_at=five_minutes_ago)
    Gpu.objects.filter(host=host).update(sampled_at=five_minutes_ago, memory_used_bytes=1)
    host.refresh_from_db()
    assert points(host, "1h") == [("11:55", 333, 70.0)]


def test_a_replay_reads_each_moment_from_the_finest_tier_still_kept() -> None:
    """``tiers(finest_at=now)``, the fair-use dry run's: raw samples from the bucket after the raw keep's
    cut-off, 5-minute rollups from the half hour after the fine keep's, the 30-minute ones before those;
    for a host whose roll-ups lag, each finer tier from its mark (nothing after a mark is pruned)."""
    week_ago = NOW - timedelta(days=7)
    caught_up = Host(history_rolled_up_until=NOW - timedelta(minutes=5),
                     history_coarse_rolled_up_until=NOW - timedelta(minutes=30))
    read = series.tiers(caught_up, week_ago, coarse=True, finest_at=NOW)
    assert read.coarse_first == retention.coarse_bucket_of(week_ago)
    assert retention.coarse_bucket_start(read.coarse_end) == NOW - timedelta(days=2, minutes=-30)
    assert read.fine_first == read.coarse_end * retention.FINE_PER_COARSE
    assert retention.bucket_start(read.fine_end) == read.raw_from == NOW - timedelta(days=1, minutes=-5)
    # A chart reads the coarsest tier that is complete: the 30-minute one up to its mark.
    chart = series.tiers(caught_up, week_ago, coarse=True)
    assert retention.coarse_bucket_start(chart.coarse_end) == NOW - timedelta(minutes=30)
    assert chart.raw_from == NOW - timedelta(minutes=5)

    lagging = Host(history_rolled_up_until=NOW - timedelta(days=3),
                   history_coarse_rolled_up_until=NOW - timedelta(days=4))
    read = series.tiers(lagging, week_ago, coarse=True, finest_at=NOW)
    assert retention.coarse_bucket_start(read.coarse_end) == NOW - timedelta(days=4)
    assert read.raw_from == NOW - timedelta(days=3)
