"""Retention: 5-minute rollups match the raw samples they summarise, pruning keeps the database bounded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Avg, Count, Max, Min

from gpuadmin.fleet.history import retention
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.intake.validation import INT32_MAX, SnapshotRejected
from gpuadmin.fleet.models import (
    Finding,
    GpuRollup,
    GpuRollupCoarse,
    GpuSample,
    Host,
    HostRollup,
    HostRollupCoarse,
    HostSample,
    ProcessLife,
    ProcessPoint,
)
from gpuadmin.fleet.tasks import maintain_history_task
from gpuadmin.probe.gpus import GpuHealth
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import at
from tests.keys import accept, signed_snapshot

pytestmark = pytest.mark.django_db

GPU0 = "GPU-sim-0000"
MiB = 1024**2


def varying_snapshot(seconds: int, **kwargs: Any) -> dict[str, Any]:
    """Values that differ from one snapshot to the next, so min, mean and max all differ (and each
    snapshot writes its raw samples: GPU 0's utilization and GPU 1's memory move past their steps)."""
    step = seconds // 10
    used = (1 + step % 7) * GiB + step * MiB + 4097  # not whole MiB: the rounding shows
    holder = proc(1000, gpu_memory={GPU0: used // 2})
    zombies = [proc(2000 + z, ppid=1000, state="Z") for z in range(step % 3)]
    gpu0 = gpu(0, used=used, utilization_percent=(step * 13) % 101)
    # GPU 0 reports its health (GPU 1 does not): temperature and power that vary, a limit that steps.
    gpu0["health"] = GpuHealth(
        temperature_celsius=40 + (step * 7) % 45, power_draw_milliwatts=90_000 + step * 1_333,
        power_limit_milliwatts=700_000 - (step // 40) * 1000,
    ).as_document()
    return snapshot(
        "gpu01",
        processes=[holder, *zombies],
        gpus=[gpu0, gpu(1, used=step * 100 * MiB, utilization_percent=None)],
        taken_at=at(seconds),
        pids_in_use=500 + step,
        **kwargs,
    )


@pytest.fixture
def twenty_minutes(ingest: Callable[..., Host]) -> Host:
    """Snapshots every 10 s for 20 minutes (four 5-minute buckets, 30 samples each)."""
    host = None
    for seconds in range(0, 1200, 10):
        host = ingest(varying_snapshot(seconds))
    assert host is not None
    return host


def raw_buckets(host: Host) -> dict[tuple[int, int], dict[str, Any]]:
    """The same summaries computed by the database from the raw rows, bucket by bucket."""
    expected = {}
    for bucket in range(retention.bucket_of(at(0)), retention.bucket_of(at(1200))):
        start = retention.bucket_start(bucket)
        rows = (
            GpuSample.objects.filter(
                gpu__host=host, taken_at__gte=start, taken_at__lt=start + timedelta(minutes=5)
            )
            .values("gpu__index")
            .annotate(
                n=Count("id"),
                used_min=Min("memory_used_bytes"),
                used_mean=Avg("memory_used_bytes"),
                used_max=Max("memory_used_bytes"),
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
        )
        for row in rows:
            expected[(row["gpu__index"], bucket)] = row
    return expected


def test_rollups_have_the_min_mean_and_max_of_the_raw_samples_of_their_bucket(twenty_minutes: Host) -> None:
    expected = raw_buckets(twenty_minutes)
    assert retention.roll_up(at(1200 + 60)) == 4
    rollups = {(r.gpu.index, r.bucket): r for r in GpuRollup.objects.select_related("gpu")}
    assert rollups.keys() == expected.keys()
    assert len(rollups) == 8
    for key, row in expected.items():
        rollup = rollups[key]
        assert rollup.sample_count == row["n"] == 30
        # MiB: the min rounded down, the max up (no peak hidden), the mean to the nearest.
        assert (rollup.memory_used_min_mib, rollup.memory_used_max_mib) == (
            row["used_min"] // MiB,
            -(-row["used_max"] // MiB),
        )
        assert rollup.memory_used_mean_mib == round(row["used_mean"] / MiB)
        assert rollup.memory_attributed_max_mib == -(-row["attributed_max"] // MiB)
        assert (rollup.utilization_min_percent, rollup.utilization_max_percent) == (
            row["util_min"],
            row["util_max"],
        )
        if row["util_mean"] is None:
            assert rollup.utilization_mean_tenths_percent is None
        else:
            assert rollup.utilization_mean_tenths_percent == round(row["util_mean"] * 10)
        # Health: the mean and max of what the GPU said (GPU 1 said nothing: null, never zero).
        maxima = (rollup.temperature_max_celsius, rollup.power_draw_max_milliwatts,
                  rollup.power_limit_max_milliwatts)
        assert maxima == (row["temperature_max"], row["power_max"], row["limit_max"])
        assert (rollup.temperature_mean_celsius, rollup.power_draw_mean_milliwatts) == (
            None if row["temperature_mean"] is None else round(row["temperature_mean"]),
            None if row["power_mean"] is None else round(row["power_mean"]),
        )
        assert (rollup.temperature_max_celsius is None) == (key[0] == 1)
    # The host's counts too: zombies cycle 0, 1, 2 and PIDs climb by one per snapshot.
    first = HostRollup.objects.order_by("bucket").first()
    assert first is not None
    assert (first.zombies_min, first.zombies_max, first.zombies_mean) == (0, 2, pytest.approx(1.0))
    assert (first.pids_in_use_min, first.pids_in_use_max) == (500, 529)
    assert first.pid_max == 4194304


def test_a_bucket_mean_weighs_each_raw_sample_by_how_long_it_held(settings: Any) -> None:
    """Raw samples are written when a figure moves (history/record.py): a burst of changes must not
    weigh as much as the calm minutes around it. Each sample holds until the next, the last until the
    bucket ends, none longer than a heartbeat and a probe interval (a host that was down)."""
    settings.GPUADMIN_HISTORY_RAW_SECONDS = 60
    settings.GPUADMIN_PROBE_INTERVAL_SECONDS = 10
    bucket = retention.bucket_of(at(0))
    assert retention.bucket_start(bucket) == at(0)
    # GPU 1 idles all five minutes but for a 10-second burst at 250 s (heartbeats every minute).
    burst = {250: (100, 9 * GiB)}
    gpu_rows = [(1, at(t), burst.get(t, (0, GiB))[1], 0, burst.get(t, (0, GiB))[0], 60, 300_000, 700_000)
                for t in (0, 60, 120, 180, 240, 250, 260)]
    # GPU 2 is heard of at 30 s and, after its host was down, at 250 s: the first holds 70 s, not 220 s.
    gpu_rows += [(2, at(30), GiB, 0, 10, None, None, None), (2, at(250), GiB, 0, 40, None, None, None)]
    rollups = {r.gpu_id: r for r in retention.gpu_rollups(reversed(gpu_rows))}  # in any order
    # (0 x 290 s + 100 x 10 s) / 300 s; the plain mean of the 7 samples would be 14.3%.
    assert rollups[1].utilization_mean_tenths_percent == 33
    assert rollups[1].memory_used_mean_mib == round((1 * 290 + 9 * 10) / 300 * 1024)
    assert (rollups[1].utilization_min_percent, rollups[1].utilization_max_percent) == (0, 100)
    assert (rollups[1].memory_used_min_mib, rollups[1].memory_used_max_mib) == (1024, 9 * 1024)
    assert rollups[1].sample_count == 7
    # (10 x 70 s + 40 x 50 s) / 120 s = 22.5%; plain: 25%.
    assert rollups[2].utilization_mean_tenths_percent == 225
    host_rows = [(5, at(t), 3 if t == 250 else 0, 0, 1000, 4194304) for t in (0, 60, 120, 180, 240, 250, 260)]
    (host,) = retention.host_rollups(host_rows)
    assert host.zombies_mean == pytest.approx(3 * 10 / 300)
    assert (host.zombies_min, host.zombies_max, host.pids_in_use_mean) == (0, 3, 1000)


def test_a_bucket_is_rolled_up_only_once_it_is_complete(twenty_minutes: Host) -> None:
    # At 12:19:59 + settle, the bucket 12:15-12:20 is still open.
    assert retention.roll_up(at(1199)) == 3
    twenty_minutes.refresh_from_db()
    assert twenty_minutes.history_rolled_up_until == at(900)
    assert retention.roll_up(at(1199)) == 0
    assert retention.roll_up(at(1200 + retention.SETTLE_SECONDS)) == 1


def test_a_run_rolls_up_a_bounded_number_of_buckets_and_the_next_one_continues(twenty_minutes: Host) -> None:
    now = at(1200 + 60)
    assert retention.roll_up(now, max_buckets=3) == 3
    assert retention.roll_up(now, max_buckets=3) == 1
    assert retention.roll_up(now, max_buckets=3) == 0
    assert GpuRollup.objects.count() == 8


def test_a_late_snapshot_in_a_bucket_not_rolled_up_yet_is_rolled_up_with_it(
    twenty_minutes: Host, ingest: Callable[..., Host]
) -> None:
    retention.roll_up(at(1199))  # 12:00-12:15 rolled up; 12:15-12:20 still open
    late = varying_snapshot(905)
    late["gpus"][0]["memory_used_bytes"] = 70 * GiB
    ingest(late, received_after_seconds=300)
    assert HostSample.objects.filter(taken_at=at(905)).exists()
    assert retention.roll_up(at(1260)) == 1
    rollup = GpuRollup.objects.get(gpu__index=0, bucket=retention.bucket_of(at(900)))
    assert (rollup.sample_count, rollup.memory_used_max_mib) == (31, 70 * 1024)


def test_a_late_snapshot_older_than_the_rolled_up_history_is_not_stored(
    twenty_minutes: Host, ingest: Callable[..., Host]
) -> None:
    retention.roll_up(at(1260))
    before = rollup_rows()
    late = varying_snapshot(5)
    late["gpus"][0]["memory_used_bytes"] = 70 * GiB
    ingest(late, received_after_seconds=1300)
    twenty_minutes.refresh_from_db()
    assert twenty_minutes.history_rolled_up_until == at(1200)
    assert not HostSample.objects.filter(taken_at=at(5)).exists()
    assert retention.roll_up(at(1260)) == 0
    assert rollup_rows() == before


def rollup_rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every stored rollup, each with all its values."""
    gpu_fields = ["gpu__uuid", "bucket", *(f.name for f in GpuRollup._meta.concrete_fields[2:])]
    host_fields = ["host__name", "bucket", *(f.name for f in HostRollup._meta.concrete_fields[2:])]
    return (
        list(GpuRollup.objects.order_by("gpu__uuid", "bucket").values_list(*gpu_fields)),
        list(HostRollup.objects.order_by("host__name", "bucket").values_list(*host_fields)),
    )


def test_a_replayed_snapshot_does_not_rewrite_the_rollups_of_pruned_samples(settings: Any) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 2
    accept("gpu01")
    captured = [signed_snapshot(varying_snapshot(seconds)) for seconds in range(0, 600, 10)]
    for message in captured:
        receive_snapshot(message, received_at=at(600))
    later = at(0) + timedelta(days=3)
    retention.maintain_history(later)
    assert not HostSample.objects.exists()  # rolled up, then pruned
    before = rollup_rows()
    rolled_up_until = Host.objects.get().history_rolled_up_until

    # Someone who can write to the broker sends the first snapshot again; the host signs one of year 1,
    # which is refused outright (older than anything central keeps), with a reason, not an overflow.
    receive_snapshot(captured[0], received_at=later)
    year_one = varying_snapshot(0)
    year_one["taken_at"] = "0001-01-01T00:00:00.000000Z"
    with pytest.raises(SnapshotRejected, match="older than anything central keeps"):
        receive_snapshot(signed_snapshot(year_one), received_at=later)
    assert not HostSample.objects.exists()
    assert Host.objects.get().history_rolled_up_until == rolled_up_until

    retention.maintain_history(later + timedelta(minutes=5))
    assert rollup_rows() == before


def test_a_host_claiming_absurd_gpu_memory_is_rolled_up_clamped_beside_the_others(
    ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 2
    settings.GPUADMIN_HISTORY_FINE_DAYS = 4  # the 5-minute rollups read below are kept
    absurd = 2**62  # bytes, 4 EiB: the schema allows up to 2**63-1
    for seconds in (0, 60):
        hog = proc(1000, gpu_memory={GPU0: absurd})
        gpus = [gpu(0, total=absurd, used=absurd)]
        gpus[0]["health"] = GpuHealth(power_draw_milliwatts=absurd,
                                      power_limit_milliwatts=absurd).as_document()
        ingest(snapshot("gpu01", processes=[hog], gpus=gpus, taken_at=at(seconds)))
        ingest(snapshot("gpu02", gpus=[gpu(0, used=10 * GiB)], taken_at=at(seconds)))

    result = retention.maintain_history(at(0) + timedelta(days=3))

    assert result.buckets_rolled_up == 2
    clamped = GpuRollup.objects.get(gpu__host__name="gpu01")
    assert (clamped.memory_used_min_mib, clamped.memory_used_mean_mib, clamped.memory_used_max_mib) == (
        INT32_MAX, INT32_MAX, INT32_MAX
    )
    assert clamped.memory_attributed_max_mib == INT32_MAX
    assert (clamped.power_draw_mean_milliwatts, clamped.power_draw_max_milliwatts,
            clamped.power_limit_max_milliwatts) == (INT32_MAX, INT32_MAX, INT32_MAX)
    assert GpuRollup.objects.get(gpu__host__name="gpu02").memory_used_max_mib == 10 * 1024
    assert (result.pruned.gpu_samples, result.pruned.host_samples) == (4, 4)


def test_a_bucket_with_more_samples_than_its_count_column_holds_is_rolled_up(
    ingest: Callable[..., Host]
) -> None:
    host = ingest(snapshot("gpu01", taken_at=at(0)))
    # A host may stamp as many snapshots into five minutes as it likes: 32,768 in all here.
    HostSample.objects.bulk_create(
        HostSample(host=host, taken_at=at(0) + timedelta(microseconds=n), process_count=0, zombie_count=0,
                   uninterruptible_count=0, pids_in_use=500, pid_max=4194304)
        for n in range(1, 2**15)
    )
    assert retention.roll_up(at(360)) == 1
    assert HostRollup.objects.get().sample_count == 2**15 - 1  # a PositiveSmallIntegerField's largest


def test_hosts_rolled_up_in_batches_get_what_each_gets_alone(ingest: Callable[..., Host]) -> None:
    # gpu03 starts ten minutes later: at the first run its mark is unset, then behind the others'.
    for seconds in range(0, 4200, 60):
        for n, name in enumerate(["gpu01", "gpu02", "gpu03", "gpu04"]):
            if name == "gpu03" and seconds < 600:
                continue
            used = (n + 1) * GiB + ((seconds * (n + 3)) % 700) * MiB
            ingest(snapshot(name, processes=[proc(1000, gpu_memory={GPU0: used // 3})],
                            gpus=[gpu(0, used=used, utilization_percent=(seconds // 60 * (n + 5)) % 101),
                                  gpu(1, used=n * GiB)],
                            taken_at=at(seconds), pids_in_use=500 + n * 7 + seconds // 60))

    def history(hosts_per_batch: int) -> tuple[list[int], list[tuple[Any, ...]]]:
        Host.objects.update(history_rolled_up_until=None, history_coarse_rolled_up_until=None)
        for model in (GpuRollup, HostRollup, GpuRollupCoarse, HostRollupCoarse):
            model.objects.all().delete()
        written = []
        for now in (at(660), at(1800 + 60), at(4200 + 60)):
            written.append(retention.roll_up(now, hosts_per_batch=hosts_per_batch))
            written.append(retention.roll_up_coarse(now, hosts_per_batch=hosts_per_batch))
        gpu_fields = ["gpu__host__name", "gpu__uuid", "bucket", *retention.GPU_ROLLUP_FIELDS]
        host_fields = ["host__name", "bucket", *retention.HOST_ROLLUP_FIELDS]
        tiers = ((GpuRollup, gpu_fields), (HostRollup, host_fields), (GpuRollupCoarse, gpu_fields),
                 (HostRollupCoarse, host_fields),
                 (Host, ["name", "history_rolled_up_until", "history_coarse_rolled_up_until"]))
        rows = [list(model.objects.values_list(*fields)) for model, fields in tiers]
        return written, [sorted(tier) for tier in rows]

    alone = history(hosts_per_batch=1)
    # By run, 5-minute then 30-minute buckets: three hosts to 12:10 (gpu03's first sample is at 12:10),
    # all to 12:30 (half past: one half hour each), all to 13:10 (one more, to 13:00).
    assert alone[0] == [3 * 2, 0, 3 * 4 + 4, 3 + 1, 4 * 8, 4]
    assert history(hosts_per_batch=2) == alone
    assert history(hosts_per_batch=retention.HOSTS_PER_ROLL_UP_BATCH) == alone


def test_a_roll_up_batch_locks_its_hosts_in_id_order_before_it_writes(ingest: Callable[..., Host]) -> None:
    """As every writer for several hosts does (``Host.objects.lock_in_id_order``): a batch that took its
    hosts' locks as its rollups' foreign keys and its marks' UPDATE reached them deadlocked with the
    usage ledger's settling, which locks a batch of hosts in id order."""
    from django.test.utils import CaptureQueriesContext

    for seconds in range(0, 900, 60):
        for name in ("gpu02", "gpu01", "gpu03"):
            ingest(snapshot(name, gpus=[gpu(0, used=GiB)], taken_at=at(seconds)))
    ids = sorted(Host.objects.values_list("pk", flat=True))
    with CaptureQueriesContext(connection) as queries:
        assert retention.roll_up(at(900)) == 2 * 3
    statements = [q["sql"] for q in queries.captured_queries]
    lock_head = 'SELECT "fleet_host"."id" AS "pk" FROM "fleet_host" WHERE "fleet_host"."id" IN'
    locks = [n for n, sql in enumerate(statements) if sql.startswith(lock_head)]
    writes = [n for n, sql in enumerate(statements) if "rollup" in sql and not sql.startswith("SELECT")]
    assert len(locks) == 1 and writes and locks[0] < min(writes)
    lock = statements[locks[0]]
    assert lock.endswith("ORDER BY 1 ASC" + (" FOR UPDATE" if connection.vendor == "postgresql" else ""))
    assert all(str(pk) in lock for pk in ids)


def test_a_host_whose_roll_up_fails_stops_neither_the_other_hosts_nor_pruning(
    ingest: Callable[..., Host],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 2
    settings.GPUADMIN_HISTORY_FINE_DAYS = 4  # the 5-minute rollups read below are kept
    broken = ingest(snapshot("gpu01", gpus=[gpu(0, used=GiB)], taken_at=at(0)))
    ingest(snapshot("gpu02", gpus=[gpu(0, used=GiB)], taken_at=at(0)))
    roll_up_hosts = retention.roll_up_hosts

    def failing_for_gpu01(host_ids: Sequence[int], start: datetime, end: datetime) -> int:
        written = roll_up_hosts(host_ids, start, end)
        if broken.pk in host_ids:
            # A real database error once its rollups are written: on PostgreSQL it spoils the transaction.
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table")
        return written

    monkeypatch.setattr(retention, "roll_up_hosts", failing_for_gpu01)
    result = retention.maintain_history(at(0) + timedelta(days=3))

    assert result.buckets_rolled_up == 1
    assert list(HostRollup.objects.values_list("host__name", flat=True)) == ["gpu02"]
    assert dict(Host.objects.values_list("name", "history_rolled_up_until")) == {
        "gpu01": None,
        "gpu02": at(0) + timedelta(days=1),  # one run rolls up at most a day per host
    }
    assert list(HostSample.objects.values_list("host__name", flat=True)) == ["gpu01"]  # not rolled up: kept
    assert "rolling up gpu01 failed" in caplog.text


def test_raw_samples_go_after_the_raw_days_and_only_once_rolled_up(
    twenty_minutes: Host, settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 2
    later = at(0) + timedelta(days=2, minutes=10)
    # Nothing is rolled up yet: old as they are, the raw rows stay.
    assert retention.prune(later).gpu_samples == 0
    assert GpuSample.objects.count() == 240
    retention.roll_up(at(1260))
    pruned = retention.prune(later)
    # Older than two days at 12:10 on day 3: the first ten minutes, 60 snapshots.
    assert (pruned.gpu_samples, pruned.host_samples) == (120, 60)
    assert HostSample.objects.order_by("taken_at").first().taken_at == at(600)  # type: ignore[union-attr]
    assert GpuRollup.objects.count() == 8


def test_a_host_rolled_up_short_of_the_raw_keep_loses_only_what_it_rolled_up(
    twenty_minutes: Host, ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 2
    other = ingest(snapshot("gpu02", taken_at=at(0)))
    retention.roll_up(at(1260))  # both hosts to 12:20
    # gpu01 back to 12:05, as if its last run had stopped there.
    Host.objects.filter(pk=twenty_minutes.pk).update(history_rolled_up_until=at(300))
    pruned = retention.prune(at(0) + timedelta(days=2, minutes=10))
    # gpu01: its first five minutes, 30 snapshots; gpu02: its one snapshot (kept until 12:10).
    assert pruned.host_samples == 30 + 1
    assert HostSample.objects.order_by("taken_at").first().taken_at == at(300)  # type: ignore[union-attr]
    assert not HostSample.objects.filter(host=other).exists()


def test_rollups_lives_points_and_findings_go_after_the_history_days(
    twenty_minutes: Host, ingest: Callable[..., Host], settings: Any
) -> None:
    settings.GPUADMIN_HISTORY_DAYS = 90
    ingest(snapshot("gpu01", processes=[], gpus=[gpu(0), gpu(1)], taken_at=at(1200)))
    retention.roll_up(at(1300))
    assert ProcessLife.objects.filter(gone_at=at(1200)).count() == 3  # the holder and two zombies
    assert ProcessPoint.objects.exists()
    assert Finding.objects.filter(resolved_at__isnull=False).exists()

    pruned = retention.prune(at(1200) + timedelta(days=90, minutes=1))
    assert pruned.gpu_rollups == 8
    assert pruned.process_lives == 3
    assert not GpuRollup.objects.exists()
    assert not ProcessLife.objects.exists()
    assert not ProcessPoint.objects.exists()
    assert not Finding.objects.filter(resolved_at__isnull=False).exists()
    assert Host.objects.filter(name="gpu01").exists()


def test_pruning_deletes_in_bounded_batches(twenty_minutes: Host) -> None:
    retention.roll_up(at(1260))
    later = at(0) + timedelta(days=30)
    pruned = retention.prune(later, batch_rows=7, max_batches=3)
    assert pruned.host_samples == 21
    assert HostSample.objects.count() == 120 - 21
    while retention.prune(later, batch_rows=7, max_batches=3).total:
        pass
    assert not HostSample.objects.exists()
    assert not GpuSample.objects.exists()


def test_the_periodic_task_rolls_up_and_prunes(twenty_minutes: Host, settings: Any) -> None:
    settings.GPUADMIN_HISTORY_RAW_DAYS = 0
    settings.GPUADMIN_HISTORY_FINE_DAYS = 90
    result = maintain_history_task.apply().get()
    # It runs "now", after T0: every bucket is complete, and no raw row is younger than zero days.
    assert result["buckets_rolled_up"] == 4
    assert result["coarse_buckets_rolled_up"] == 1  # 12:00-12:30, closed by the 5-minute tier's mark
    assert result["rows_pruned"] == 240 + 120
    assert GpuRollup.objects.count() == 8
    assert not GpuSample.objects.exists()
    assert maintain_history_task.queue == "central"
