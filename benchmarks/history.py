"""History on PostgreSQL: what 30 days of one busy host cost to keep, and what its charts cost to serve.

On a throwaway PostgreSQL (tests/services.py), one host with --gpus GPUs lives
--days days of simulated work, ending now:

- jobs come and go on every GPU (20 minutes to 12 hours each, idle gaps of up
  to an hour; one in ten leaks memory, one in ten sits idle holding it), a
  parent that forgets to reap leaves zombies now and then;
- raw samples are written as ingest writes them, one GPU row per GPU and one
  host row per 10 s snapshot (bulk inserts: ingesting 259,200 snapshots one by
  one would take hours and measure ingest, not history);
- process lives and their points go through the real code
  (``record.record_process_lives``), once a simulated minute;
- after each simulated day the real periodic task's service runs
  (``retention.maintain_history``): rollups, pruning.

Then it prints the bytes kept per host-day once rolled up (rollups, process
lives and points: everything older than the raw days; aim <= 0.5 MB), what the
raw days cost on top, and the server time of the chart requests (the JSON API
through django.test.Client: middleware, auth, view, renderer; median and p95 of
--repeats after two warm-ups) for 30 days and 24 hours (required < 200 ms,
aim < 50 ms). Growth with the GPU count: hosts with --growth GPUs get 30 days
of rollups inserted directly, and the same requests are timed.

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
from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402
from tests import services  # noqa: E402

GiB = 1024**3
MiB = 1024**2
SNAPSHOT_SECONDS = 10
LIVES_EVERY_SECONDS = 60
WARM_UP_REQUESTS = 2
REQUIRED_MS = 200.0
AIM_MS = 50.0
AIM_BYTES_PER_HOST_DAY = 0.5 * 1024 * 1024
BOOT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
HISTORY_TABLES = ["fleet_gpurollup", "fleet_hostrollup", "fleet_processlife", "fleet_processpoint"]
RAW_TABLES = ["fleet_gpusample", "fleet_hostsample"]


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

    def memory_at(self, t: float, rng: random.Random) -> int:
        """Ramp up over two minutes, then a plateau with allocator noise; a leak climbs 200 MiB / 10 min."""
        age = t - self.start
        ramp = min(1.0, age / 120)
        memory = int(self.plateau_bytes * ramp) + rng.randrange(-40, 40) * MiB
        if self.leaks:
            memory += int(age / 600) * 200 * MiB
        return max(0, memory)


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
                )
            )
            t += length + rng.uniform(60, 3600)
    return schedule


def zombies_at(t: float, start: float) -> int:
    """A forgetful parent: every third day its zombies pile up for six hours, then it is restarted."""
    hours = (t - start) / 3600
    day, hour = int(hours // 24), hours % 24
    return int((hour - 8) * 30) if day % 3 == 0 and 8 <= hour < 14 else 0


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
            busy = [False] * gpus
            for job in running:
                used[job.gpu] += job.memory_at(t, rng)
                busy[job.gpu] = busy[job.gpu] or not job.idle
            for i, gpu in enumerate(gpu_rows):
                gpu_samples.append(
                    GpuSample(
                        gpu=gpu,
                        taken_at=taken_at,
                        memory_used_bytes=used[i] + 600 * MiB,
                        memory_attributed_bytes=used[i],
                        utilization_percent=rng.randrange(70, 101) if busy[i] else 0,
                    )
                )
            zombies = zombies_at(t, start)
            host_samples.append(
                HostSample(
                    host=host,
                    taken_at=taken_at,
                    process_count=900 + 20 * len(running) + zombies,
                    zombie_count=zombies,
                    uninterruptible_count=1 if rng.random() < 0.01 else 0,
                    pids_in_use=1400 + 40 * len(running) + zombies,
                    pid_max=4194304,
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
    """A host with `gpus` GPUs and `days` of rollups (and its last 10 minutes raw), inserted directly."""
    from gpuadmin.fleet.history import retention
    from gpuadmin.fleet.models import Gpu, GpuRollup, GpuSample, Host, HostRollup

    host = Host.objects.create(name=host_name, boot_id=BOOT_ID, pid_max=4194304)
    gpu_rows = Gpu.objects.bulk_create(
        Gpu(host=host, uuid=f"{gpu_uuid(gpus, i)}-g", index=i, name="Simulated H100") for i in range(gpus)
    )
    last = retention.bucket_of(now) - 2
    first = last - days * 288
    rollups, host_rollups = [], []
    for bucket in range(first, last):
        for gpu in gpu_rows:
            used = rng.randrange(0, 80 * 1024)
            rollups.append(
                GpuRollup(
                    gpu=gpu,
                    bucket=bucket,
                    sample_count=30,
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
            HostRollup(
                host=host,
                bucket=bucket,
                sample_count=30,
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
    GpuRollup.objects.bulk_create(rollups, batch_size=10_000)
    HostRollup.objects.bulk_create(host_rollups, batch_size=10_000)
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
    Host.objects.filter(pk=host.pk).update(history_rolled_up_until=tail_start)
    return host


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


def table_bytes(names: list[str]) -> dict[str, int]:
    from django.db import connection

    vacuum()
    with connection.cursor() as cursor:
        sizes = {}
        for name in names:
            cursor.execute("SELECT pg_total_relation_size(%s)", [name])
            sizes[name] = cursor.fetchone()[0]
    return sizes


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
    with throwaway_data_dir("gpuadmin-history-bench-", wait=not args.no_wait), \
            services.postgres_server() as server:
        setup_django(server.url)
        return run(args)


def run(args: argparse.Namespace) -> int:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from gpuadmin.fleet.models import GpuRollup, ProcessLife, ProcessPoint

    rng = random.Random(args.seed)
    now = timezone.now()
    simulate("gpu-bench", args.gpus, args.days, now, rng)
    # Sizes before the other hosts exist: one host's history only.
    kept = table_bytes(HISTORY_TABLES)
    raw = table_bytes(RAW_TABLES)
    per_day = sum(kept.values()) / args.days
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM fleet_gpusample")
        raw_rows = cursor.fetchone()[0]

    user = User.objects.create_superuser("bench", password="x")
    client = Client()
    client.force_login(user)
    print(
        f"\nPostgreSQL {connection.pg_version // 10000}, {args.days} simulated days, {args.gpus} GPUs, "
        f"one snapshot every {SNAPSHOT_SECONDS} s\n"
    )
    print("kept once rolled up (older than the raw days)      bytes")
    for name, size in kept.items():
        print(f"  {name:<40} {size:>12,}")
    print(f"  {'per host-day':<40} {per_day:>12,.0f}  ({per_day / 1024 / 1024:.2f} MB; aim <= 0.5 MB)")
    print(
        f"  rows: {GpuRollup.objects.count():,} GPU rollups, {ProcessLife.objects.count():,} process lives, "
        f"{ProcessPoint.objects.count():,} process points"
    )
    print("raw samples (the last raw days, on top)")
    for name, size in raw.items():
        print(f"  {name:<40} {size:>12,}")
    print(f"  ({raw_rows:,} GPU sample rows)\n")

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
