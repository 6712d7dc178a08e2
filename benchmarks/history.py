"""History on PostgreSQL: what 30 days of one busy host cost to keep, and what its charts cost to serve.

On a throwaway PostgreSQL (tests/services.py), one host with --gpus GPUs lives
--days days of simulated work, ending now:

- jobs come and go on every GPU (20 minutes to 12 hours each, idle gaps of up
  to an hour; one in ten leaks memory, one in ten sits idle holding it), a
  parent that forgets to reap leaves zombies now and then;
- a training job holds its memory within a few MiB and its utilization within
  a few points of its level (a new level about once an hour); temperature and
  power draw follow with sensor noise;
- raw samples are written as ingest writes them: of a 10 s snapshot, a GPU's
  or the host's only when ingest's own decision (``record.decide_gpu_samples``,
  ``record.decide_host_sample``) says a figure moved past its step or the last
  one is a minute old (bulk inserts: ingesting 259,200 snapshots one by one
  would take hours and measure ingest, not history);
- process lives and their points go through the real code
  (``record.record_process_lives``), once a simulated minute;
- after each simulated day the real periodic task's service runs
  (``retention.maintain_history``): rollups, pruning.

Then it prints the bytes per host-day of each history tier (indexes included,
after VACUUM ANALYZE): raw samples, 5-minute rollups, 30-minute rollups,
process lives and points, each divided by the days it holds at the end. As
stored, every day partition summed, and at scale (``bytes_at_scale``: one
host's day partitions are mostly the empty space pages start with, which a
fleet's fill); the per host-day figures are at scale. Then the standing
storage per host-day over the default
keep, (raw days x raw + fine days x fine + history days x (coarse + process
history)) / history days. Then the server time of the chart requests (the JSON API
through django.test.Client: middleware, auth, view, renderer; median and p95 of
--repeats after two warm-ups) for 30 days and 24 hours (required < 200 ms,
aim < 50 ms). Growth with the GPU count: hosts with --growth GPUs get 30 days
of 30-minute rollups and the last fine days of 5-minute ones inserted directly,
and the same requests are timed.

    python benchmarks/history.py [--days 30] [--gpus 8] [--growth 1,8,16,32] [--repeats 15] [--no-wait]

Exit status 1 when a chart request takes 200 ms or more (median).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_on_postgres  # noqa: E402

GiB = 1024**3
MiB = 1024**2
SNAPSHOT_SECONDS = 10
LIVES_EVERY_SECONDS = 60
WARM_UP_REQUESTS = 2
REQUIRED_MS = 200.0
AIM_MS = 50.0
AIM_BYTES_PER_HOST_DAY = 0.2 * 1024 * 1024  # issue 36: standing storage per host-day
BOOT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]


@dataclass(frozen=True)
class Tier:
    """History tables kept alike: their names, and SQL for the (first, last) second their rows cover."""

    name: str
    tables: tuple[str, ...]
    span_sql: str


TIERS = (
    Tier("raw samples", ("fleet_gpusample", "fleet_hostsample"),
         "SELECT extract(epoch FROM min(taken_at)), extract(epoch FROM max(taken_at)) + 10 "
         "FROM fleet_hostsample"),
    Tier("5-minute rollups", ("fleet_gpurollup", "fleet_hostrollup"),
         "SELECT min(bucket) * 300, (max(bucket) + 1) * 300 FROM fleet_hostrollup"),
    Tier("30-minute rollups", ("fleet_gpurollupcoarse", "fleet_hostrollupcoarse"),
         "SELECT min(bucket) * 1800, (max(bucket) + 1) * 1800 FROM fleet_hostrollupcoarse"),
    Tier("process lives and points", ("fleet_processlife", "fleet_processpoint"),
         "SELECT extract(epoch FROM min(taken_at)), extract(epoch FROM max(taken_at)) "
         "FROM fleet_processpoint"),
)


@dataclass
class Job:
    gpu: int
    pid: int
    start: float  # Unix seconds
    end: float
    plateau_bytes: int
    user: str
    leaks: bool
    idle: bool
    utilization_percent: int  # the level a training job holds; jitters a few points, moves now and then

    def memory_at(self, t: float, rng: random.Random) -> int:
        """Ramp up over two minutes, then a plateau the caching allocator holds within a few MiB; a leak
        climbs 200 MiB / 10 min."""
        age = t - self.start
        ramp = min(1.0, age / 120)
        memory = int(self.plateau_bytes * ramp) + rng.randrange(-4, 5) * MiB
        if self.leaks:
            memory += int(age / 600) * 200 * MiB
        return max(0, memory)

    def utilization_at(self, rng: random.Random) -> int:
        """Its level with a few points of jitter; about once an hour a new level (an evaluation pass, a
        slower data loader)."""
        if rng.random() < SNAPSHOT_SECONDS / 3600:
            self.utilization_percent = rng.randrange(40, 99)
        return max(0, min(100, self.utilization_percent + rng.randrange(-3, 4)))


@dataclass
class Schedule:
    jobs: list[Job] = field(default_factory=list)

    def running(self, t: float) -> list[Job]:
        return [job for job in self.jobs if job.start <= t < job.end]


def make_schedule(gpus: int, start: float, end: float, rng: random.Random) -> Schedule:
    schedule = Schedule()
    pid = 10_000
    for gpu in range(gpus):
        t = start + rng.uniform(0, 3600)
        while t < end:
            length = rng.uniform(20 * 60, 12 * 3600)
            pid += rng.randrange(1, 400)
            schedule.jobs.append(
                Job(
                    gpu=gpu,
                    pid=pid,
                    start=t,
                    end=min(end, t + length),
                    plateau_bytes=rng.randrange(10, 70) * GiB,
                    user=rng.choice(USERS),
                    leaks=rng.random() < 0.1,
                    idle=rng.random() < 0.1,
                    utilization_percent=rng.randrange(60, 99),
                )
            )
            t += length + rng.uniform(60, 3600)
    return schedule


def zombies_at(t: float, start: float) -> int:
    """A forgetful parent: every third day its zombies pile up for six hours, then it is restarted."""
    hours = (t - start) / 3600
    day, hour = int(hours // 24), hours % 24
    return int((hour - 8) * 30) if day % 3 == 0 and 8 <= hour < 14 else 0


@dataclass
class SampledGpu:
    """What ingest's decision reads and sets of a GPU's row (``record.GpuRow``): its last written
    sample's moment and figures, kept here between simulated snapshots as the Gpu row keeps them."""

    uuid: str
    pk: int
    idle_since: datetime | None = None
    sampled_at: datetime | None = None
    sampled: tuple[int | None, ...] | None = None


def gpu_figures(attributed_bytes: int, utilization_percent: int, rng: random.Random) -> tuple[int, ...]:
    """A GPU's figures in a snapshot: the driver's own 600 MiB beside its jobs' memory; temperature and
    power draw follow utilization, with a degree and a few watts of sensor noise."""
    return (attributed_bytes + 600 * MiB, attributed_bytes, utilization_percent,
            32 + utilization_percent * 45 // 100 + rng.randrange(-1, 2),
            (70 + utilization_percent * 6) * 1000 + rng.randrange(-5, 6) * 1000, 700_000)


def gpu_uuid(gpus: int, index: int) -> str:
    return f"GPU-bench-{gpus:02d}-{index:04d}"


def simulate(host_name: str, gpus: int, days: int, now: datetime, rng: random.Random) -> Any:
    from gpuadmin.fleet.history import record, retention
    from gpuadmin.fleet.models import Gpu, GpuSample, Host, HostSample
    from gpuadmin.fleet.process_tree import ProcessRow
    from tests.factories import proc

    end = now.timestamp()
    start = end - days * 86400
    host = Host.objects.create(
        name=host_name, first_seen_at=datetime.fromtimestamp(start, UTC), boot_id=BOOT_ID, pid_max=4194304
    )
    gpu_rows = Gpu.objects.bulk_create(
        Gpu(host=host, uuid=gpu_uuid(gpus, i), index=i, name="Simulated H100", memory_total_bytes=80 * GiB)
        for i in range(gpus)
    )
    gpus_sampled = [SampledGpu(uuid=gpu.uuid, pk=gpu.pk) for gpu in gpu_rows]
    # A GpuSample's columns in the order of record's Figures.
    sample_fields = [name.removeprefix("sampled_") for name in record.GPU_SAMPLED_FIELDS]
    schedule = make_schedule(gpus, start, end, rng)
    print(f"{host_name}: {len(schedule.jobs)} jobs over {days} days on {gpus} GPUs", file=sys.stderr)
    started = time.monotonic()
    lives_taken_at: datetime | None = None  # the lives' previous snapshot
    for day in range(days):
        day_start, day_end = start + day * 86400, start + (day + 1) * 86400
        gpu_samples, host_samples = [], []
        t = day_start
        while t < day_end:
            taken_at = datetime.fromtimestamp(t, UTC)
            running = schedule.running(t)
            used = [0] * gpus
            utilization = [0] * gpus
            for job in running:
                used[job.gpu] += job.memory_at(t, rng)
                if not job.idle:
                    utilization[job.gpu] = max(utilization[job.gpu], job.utilization_at(rng))
            record.decide_gpu_samples(
                ((gpu, gpu_figures(used[i], utilization[i], rng)) for i, gpu in enumerate(gpus_sampled)),
                taken_at=taken_at,
            )
            gpu_samples.extend(
                GpuSample(gpu_id=gpu.pk, taken_at=taken_at,
                          **dict(zip(sample_fields, gpu.sampled, strict=True)))
                for gpu in gpus_sampled
                if gpu.sampled_at == taken_at and gpu.sampled is not None
            )
            zombies = zombies_at(t, start)
            record.decide_host_sample(
                host,
                zombies=zombies,
                uninterruptible=1 if rng.random() < 0.01 else 0,
                pids_in_use=1400 + 40 * len(running) + zombies + rng.randrange(-20, 21),
                pid_max=4194304,
                taken_at=taken_at,
            )
            if host.sampled_at == taken_at:
                host_samples.append(
                    HostSample(
                        host=host,
                        taken_at=taken_at,
                        process_count=900 + 20 * len(running) + zombies,
                        zombie_count=host.sampled_zombie_count,
                        uninterruptible_count=host.sampled_uninterruptible_count,
                        pids_in_use=host.sampled_pids_in_use,
                        pid_max=host.sampled_pid_max,
                    )
                )
            if int(t - day_start) % LIVES_EVERY_SECONDS == 0:
                rows = {
                    job.pid: ProcessRow.from_document(
                        proc(
                            job.pid,
                            ppid=job.pid - 1,
                            state="R" if not job.idle else "S",
                            start=int(job.start * 100),
                            user=job.user,
                            gpu_memory={gpu_uuid(gpus, job.gpu): job.memory_at(t, rng)},
                            device_files=[f"/dev/nvidia{job.gpu}"],
                            reasons=["gpu"],
                        )
                    )
                    for job in running
                }
                record.record_process_lives(host, rows, boot_id=BOOT_ID, taken_at=taken_at,
                                            previous_taken_at=lives_taken_at)
                lives_taken_at = taken_at
            t += SNAPSHOT_SECONDS
        GpuSample.objects.bulk_create(gpu_samples, batch_size=10_000)
        HostSample.objects.bulk_create(host_samples, batch_size=10_000)
        done = retention.maintain_history(datetime.fromtimestamp(day_end + retention.SETTLE_SECONDS, UTC))
        vacuum()  # autovacuum's part: the space of pruned rows is reused by the next day's
        print(
            f"  day {day + 1:2d}: {done.buckets_rolled_up} buckets rolled up, {done.pruned.total} pruned "
            f"({time.monotonic() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return Host.objects.get(pk=host.pk)


def insert_rollups(host_name: str, gpus: int, days: int, now: datetime, rng: random.Random) -> Any:
    """A host with `gpus` GPUs and `days` of 30-minute rollups, the last GPUADMIN_HISTORY_FINE_DAYS of
    5-minute ones (the last half hours only those), and its last 10 minutes raw, inserted directly."""
    from django.conf import settings

    from gpuadmin.fleet.history import retention
    from gpuadmin.fleet.models import (
        Gpu,
        GpuRollup,
        GpuRollupCoarse,
        GpuSample,
        Host,
        HostRollup,
        HostRollupCoarse,
    )

    host = Host.objects.create(name=host_name, boot_id=BOOT_ID, pid_max=4194304)
    gpu_rows = Gpu.objects.bulk_create(
        Gpu(host=host, uuid=f"{gpu_uuid(gpus, i)}-g", index=i, name="Simulated H100") for i in range(gpus)
    )
    last = retention.bucket_of(now) - 2
    coarse_last = last // retention.FINE_PER_COARSE
    first = min(coarse_last * retention.FINE_PER_COARSE, last - settings.GPUADMIN_HISTORY_FINE_DAYS * 288)
    coarse = range(coarse_last - days * 48, coarse_last)
    insert_rollup_rows((GpuRollupCoarse, HostRollupCoarse), host, gpu_rows, coarse, rng=rng,
                       fine_per_row=retention.FINE_PER_COARSE)
    insert_rollup_rows((GpuRollup, HostRollup), host, gpu_rows, range(first, last), rng=rng, fine_per_row=1)
    tail_start = retention.bucket_start(last)
    GpuSample.objects.bulk_create(
        GpuSample(
            gpu=gpu,
            taken_at=tail_start + timedelta(seconds=s),
            memory_used_bytes=GiB,
            memory_attributed_bytes=GiB,
            utilization_percent=50,
        )
        for gpu in gpu_rows
        for s in range(0, int((now - tail_start).total_seconds()), SNAPSHOT_SECONDS)
    )
    Host.objects.filter(pk=host.pk).update(
        history_rolled_up_until=tail_start,
        history_coarse_rolled_up_until=retention.coarse_bucket_start(coarse_last))
    return host


def insert_rollup_rows(tier: tuple[Any, Any], host: Any, gpu_rows: list[Any], buckets: range, *,
                       fine_per_row: int, rng: random.Random) -> None:
    """One tier's rows (``fine_per_row``: 5-minute buckets per row, 6 for the 30-minute tier)."""
    model, host_model = tier
    extra = {"fine_bucket_count": fine_per_row} if fine_per_row > 1 else {}
    rollups, host_rollups = [], []
    for bucket in buckets:
        for gpu in gpu_rows:
            used = rng.randrange(0, 80 * 1024)
            rollups.append(
                model(
                    gpu=gpu,
                    bucket=bucket,
                    sample_count=30 * fine_per_row,
                    **extra,
                    memory_used_min_mib=used,
                    memory_used_mean_mib=used,
                    memory_used_max_mib=used,
                    memory_attributed_min_mib=used,
                    memory_attributed_mean_mib=used,
                    memory_attributed_max_mib=used,
                    utilization_min_percent=0,
                    utilization_mean_tenths_percent=500,
                    utilization_max_percent=100,
                )
            )
        host_rollups.append(
            host_model(
                host=host,
                bucket=bucket,
                sample_count=30 * fine_per_row,
                **extra,
                zombies_min=0,
                zombies_mean=1.0,
                zombies_max=2,
                d_state_min=0,
                d_state_mean=0.0,
                d_state_max=0,
                pids_in_use_min=1000,
                pids_in_use_mean=1000.0,
                pids_in_use_max=1000,
                pid_max=4194304,
            )
        )
    model.objects.bulk_create(rollups, batch_size=10_000)
    host_model.objects.bulk_create(host_rollups, batch_size=10_000)


def time_request(client: Any, url: str, repeats: int) -> tuple[float, float, int]:
    for _ in range(WARM_UP_REQUESTS):
        assert client.get(url).status_code == 200
    times = []
    size = 0
    for _ in range(repeats):
        begin = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - begin) * 1000)
        assert response.status_code == 200, response.content[:300]
        size = len(response.content)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)], size


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def table_bytes(names: tuple[str, ...]) -> dict[str, int]:
    """Each table's bytes with its indexes, every day partition summed (a partitioned table has none)."""
    from django.db import connection

    vacuum()
    with connection.cursor() as cursor:
        sizes = {}
        for name in names:
            cursor.execute("SELECT coalesce(sum(pg_total_relation_size(relid)), pg_total_relation_size(%s)) "
                           "FROM pg_partition_tree(%s)", [name, name])
            sizes[name] = int(cursor.fetchone()[0])
    return sizes


SCRATCH_ROWS = 200_000


def bytes_at_scale(name: str) -> int:
    """One host's rows of ``name`` as they cost in a fleet's table: copied enough times (other ids) into
    an unpartitioned scratch table with the same columns and indexes that a day partition's pages are
    full, as at 10,000 hosts, and that size divided by the copies. One host's day partitions hold a few
    pages each, mostly the empty space of a page each table and index starts with."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM " + connection.ops.quote_name(name))
        rows = cursor.fetchone()[0]
        if not rows:
            return 0
        copies = min(200, -(-SCRATCH_ROWS // rows))
        cursor.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s "
                       "ORDER BY ordinal_position", [name])
        columns = [
            f"{column} + %(offset)s" if (column == "id" or column.endswith("_id"))
            and kind in ("integer", "bigint") else column
            for column, kind in cursor.fetchall()
        ]
        cursor.execute("DROP TABLE IF EXISTS bench_scratch")
        cursor.execute(f"CREATE TEMP TABLE bench_scratch (LIKE {connection.ops.quote_name(name)} "
                       "INCLUDING DEFAULTS INCLUDING INDEXES)")
        select = f"SELECT {', '.join(columns)} FROM {connection.ops.quote_name(name)}"
        for copy in range(copies):
            cursor.execute(f"INSERT INTO bench_scratch {select}", {"offset": copy * 10_000_000})
    vacuum()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('bench_scratch')")
        size = int(cursor.fetchone()[0])
        cursor.execute("DROP TABLE bench_scratch")
    return size // copies


@dataclass(frozen=True)
class TierSize:
    tier: Tier
    tables: dict[str, int]  # as stored for the one simulated host
    at_scale: dict[str, int]  # as its rows cost in a fleet's tables (bytes_at_scale)
    days_held: float

    @property
    def per_host_day(self) -> float:
        return sum(self.at_scale.values()) / self.days_held if self.days_held else 0.0


def tier_sizes() -> list[TierSize]:
    """Bytes of each tier, and the days its rows cover (one host's history: before the other hosts exist)."""
    from django.db import connection

    sizes = []
    for tier in TIERS:
        with connection.cursor() as cursor:
            cursor.execute(tier.span_sql)
            first, last = cursor.fetchone()
        days = 0.0 if first is None else float(last - first) / 86400
        at_scale = {table: bytes_at_scale(table) for table in tier.tables}
        sizes.append(TierSize(tier, table_bytes(tier.tables), at_scale, days))
    return sizes


def standing_per_host_day(sizes: list[TierSize]) -> tuple[float, str]:
    """Bytes kept per host-day over the default keep, and the sum written out."""
    from django.conf import settings

    raw, fine, coarse, lives = (size.per_host_day for size in sizes)
    keep = {"raw": settings.GPUADMIN_HISTORY_RAW_DAYS, "fine": settings.GPUADMIN_HISTORY_FINE_DAYS,
            "history": settings.GPUADMIN_HISTORY_DAYS}
    total = (keep["raw"] * raw + keep["fine"] * fine + keep["history"] * (coarse + lives)) / keep["history"]
    formula = (f"({keep['raw']} x raw + {keep['fine']} x 5-min + {keep['history']} x (30-min + process)) "
               f"/ {keep['history']}")
    return total, formula


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--growth", default="1,8,16,32", help="GPU counts for the growth table")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    processes.guard()
    with django_on_postgres("gpuadmin-history-bench-", wait=not args.no_wait):
        return run(args)


def run(args: argparse.Namespace) -> int:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from gpuadmin.fleet.models import GpuRollup, GpuRollupCoarse, ProcessLife, ProcessPoint

    rng = random.Random(args.seed)
    now = timezone.now()
    simulate("gpu-bench", args.gpus, args.days, now, rng)
    # Sizes before the other hosts exist: one host's history only.
    sizes = tier_sizes()
    standing, formula = standing_per_host_day(sizes)

    user = User.objects.create_superuser("bench", password="x")
    client = Client()
    client.force_login(user)
    print(
        f"\nPostgreSQL {connection.pg_version // 10000}, {args.days} simulated days, {args.gpus} GPUs, "
        f"one snapshot every {SNAPSHOT_SECONDS} s\n"
    )
    print(f"{'history tier (indexes included)':<34} {'as stored':>12} {'at scale':>12} {'days held':>9} "
          f"{'per host-day at scale':>22}")
    for size in sizes:
        print(f"{size.tier.name:<34} {sum(size.tables.values()):>12,} {sum(size.at_scale.values()):>12,} "
              f"{size.days_held:>9.2f} {size.per_host_day:>13,.0f} ({size.per_host_day / MiB:.3f} MB)")
        for name, table in size.tables.items():
            print(f"  {name:<32} {table:>12,} {size.at_scale[name]:>12,}")
    print(
        f"  rows: {GpuRollup.objects.count():,} GPU 5-minute rollups, {GpuRollupCoarse.objects.count():,} "
        f"30-minute, {ProcessLife.objects.count():,} process lives, {ProcessPoint.objects.count():,} points"
    )
    print(f"standing storage per host-day, {formula}: {standing:,.0f} bytes ({standing / MiB:.3f} MB; "
          f"aim <= {AIM_BYTES_PER_HOST_DAY / MiB:.1f} MB)\n")

    failed = False
    print(f"{'request':<58} {'median ms':>9} {'p95 ms':>8} {'bytes':>10}")
    for range_name in ("30d", "7d", "24h", "1h"):
        url = f"/api/v1/hosts/gpu-bench/history/?range={range_name}"
        median, p95, size = time_request(client, url, args.repeats)
        print(f"{url:<58} {median:>9.1f} {p95:>8.1f} {size:>10,}")
        failed |= range_name in ("30d", "24h") and median >= REQUIRED_MS
    life = ProcessLife.objects.order_by("-peak_gpu_memory_bytes").first()
    if life is not None:
        url = f"/api/v1/hosts/gpu-bench/processes/{life.pid}-{life.start_time_ticks}/"
        median, p95, size = time_request(client, url, args.repeats)
        print(f"{url:<58} {median:>9.1f} {p95:>8.1f} {size:>10,}")

    print(f"\ngrowth with the GPU count ({args.days} days of rollups inserted directly)")
    print(f"{'GPUs':>5} {'30d median ms':>14} {'30d bytes':>10} {'24h median ms':>14} {'24h bytes':>10}")
    for count in (int(g) for g in args.growth.split(",") if g):
        name = f"gpu-growth-{count}"
        insert_rollups(name, count, args.days, now, rng)
        month = time_request(client, f"/api/v1/hosts/{name}/history/?range=30d", args.repeats)
        day = time_request(client, f"/api/v1/hosts/{name}/history/?range=24h", args.repeats)
        print(f"{count:>5} {month[0]:>14.1f} {month[2]:>10,} {day[0]:>14.1f} {day[2]:>10,}")
        failed |= count <= args.gpus and max(month[0], day[0]) >= REQUIRED_MS

    verdict = "meets" if not failed else "MISSES"
    print(
        f"\nchart requests {verdict} the requirement (< {REQUIRED_MS:.0f} ms median; aim < {AIM_MS:.0f} ms)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
