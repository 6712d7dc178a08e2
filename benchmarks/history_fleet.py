"""History roll-ups at fleet scale: what beat's history task costs, host by host and in batches.

On a throwaway PostgreSQL (tests/services.py), --hosts hosts with --gpus GPUs each
and --minutes of raw samples ending on a half hour: a GPU's row and a host's row
a minute, as a steady fleet's heartbeat writes them (``history/record.py``),
figures drawn by the server (INSERT ... SELECT over generate_series). Then
--repeats rounds, each running both ways, alternating which goes first: the
real roll-ups (``retention.roll_up``, then ``retention.roll_up_coarse``) a host a
batch (``hosts_per_batch=1``: a transaction and its statements per host, as
before batching) and ``HOSTS_PER_ROLL_UP_BATCH`` hosts a batch, from the same
start, in two cases:

- catch-up: no host rolled up yet, all --minutes to roll up (a new central, or
  one back after downtime);
- steady: every host one 5-minute bucket behind, which closes a half hour (the
  beat's run at every half hour; the runs between write only the 5-minute tier).

For each: seconds, this process's CPU, its PostgreSQL backend's CPU, and
buckets written; both ways must write the same rollups and marks (a digest of
their rows). Then one ``retention.prune`` (nothing is past keeping: what finding
that out costs).

    python benchmarks/history_fleet.py [--hosts 2000] [--gpus 8] [--minutes 60] [--repeats 3] [--no-wait]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_on_postgres  # noqa: E402
from benchmarks.fleet import Spent, database_server_pid, spent  # noqa: E402

BOOT_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
GiB = 1024**3

_GPU_SAMPLES = """
INSERT INTO fleet_gpusample (gpu_id, taken_at, memory_used_bytes, memory_attributed_bytes,
                             utilization_percent, temperature_celsius, power_draw_milliwatts,
                             power_limit_milliwatts)
SELECT g.id, %(start)s::timestamptz + m * interval '1 minute' + (g.id %% 50) * interval '1 second',
       used_mib * 1048576, used_mib * 524288,
       (random() * 100)::int, 35 + (random() * 45)::int, (random() * 700000)::bigint, 700000
FROM fleet_gpu g CROSS JOIN generate_series(0, %(minutes)s - 1) m
CROSS JOIN LATERAL (SELECT ((g.id * 7919 + m * 104729) %% 81920)::bigint AS used_mib) used
"""
_HOST_SAMPLES = """
INSERT INTO fleet_hostsample (host_id, taken_at, process_count, zombie_count, uninterruptible_count,
                              pids_in_use, pid_max)
SELECT h.id, %(start)s::timestamptz + m * interval '1 minute' + (h.id %% 50) * interval '1 second',
       300 + (random() * 200)::int, (random() < 0.05)::int, 0, 1200 + (random() * 400)::int, 4194304
FROM fleet_host h CROSS JOIN generate_series(0, %(minutes)s - 1) m
"""


@dataclass(frozen=True)
class Cost:
    """One run of the roll-ups: what it took, and the buckets it rolled up."""

    spent: Spent
    buckets: int
    coarse_buckets: int


def fleet(hosts: int, gpus: int, start: datetime, minutes: int) -> None:
    """The hosts, their GPUs, and their raw samples of [start, start + minutes)."""
    from django.db import connection

    from gpuadmin.fleet.models import Gpu, Host

    made = Host.objects.bulk_create(
        (Host(name=f"bench-{n:05d}", boot_id=BOOT_ID, pid_max=4194304) for n in range(hosts)), batch_size=2000
    )
    Gpu.objects.bulk_create(
        (Gpu(host=host, uuid=f"GPU-bench-{host.pk:05d}-{i}", index=i, name="Simulated H100",
             memory_total_bytes=80 * GiB) for host in made for i in range(gpus)),
        batch_size=5000,
    )
    with connection.cursor() as cursor:
        for sql in (_GPU_SAMPLES, _HOST_SAMPLES):
            cursor.execute(sql, {"start": start, "minutes": minutes})
        cursor.execute("ANALYZE")


def reset(case: str, end: datetime) -> None:
    """Marks and rollups as the case starts from: none rolled up (catch-up), or a bucket behind (steady)."""
    from gpuadmin.fleet.history import retention
    from gpuadmin.fleet.models import GpuRollup, GpuRollupCoarse, Host, HostRollup, HostRollupCoarse

    if case == "catch-up":
        for model in (GpuRollup, HostRollup, GpuRollupCoarse, HostRollupCoarse):
            model.objects.all().delete()
        Host.objects.update(history_rolled_up_until=None, history_coarse_rolled_up_until=None)
        return
    last = retention.bucket_of(end) - 1
    last_coarse = retention.coarse_bucket_of(end) - 1
    GpuRollup.objects.filter(bucket__gte=last).delete()
    HostRollup.objects.filter(bucket__gte=last).delete()
    GpuRollupCoarse.objects.filter(bucket__gte=last_coarse).delete()
    HostRollupCoarse.objects.filter(bucket__gte=last_coarse).delete()
    Host.objects.update(history_rolled_up_until=retention.bucket_start(last),
                        history_coarse_rolled_up_until=retention.coarse_bucket_start(last_coarse))


def timed(now: datetime, hosts_per_batch: int, server_pid: int | None) -> Cost:
    from gpuadmin.fleet.history import retention

    with spent(server_pid) as cost:
        buckets = retention.roll_up(now, hosts_per_batch=hosts_per_batch)
        coarse = retention.roll_up_coarse(now, hosts_per_batch=hosts_per_batch)
    return Cost(cost, buckets, coarse)


def digest() -> str:
    """What the roll-ups wrote: every rollup row (less its id) and every host's marks, in a stable order."""
    from gpuadmin.fleet.history import retention
    from gpuadmin.fleet.models import GpuRollup, GpuRollupCoarse, Host, HostRollup, HostRollupCoarse

    gpu_fields = ["gpu_id", "bucket", *retention.GPU_ROLLUP_FIELDS]
    host_fields = ["host_id", "bucket", *retention.HOST_ROLLUP_FIELDS]
    tiers: list[tuple[Any, list[str]]] = [
        (GpuRollup, gpu_fields), (HostRollup, host_fields), (GpuRollupCoarse, gpu_fields),
        (HostRollupCoarse, host_fields),
        (Host, ["pk", "history_rolled_up_until", "history_coarse_rolled_up_until"]),
    ]
    summary = hashlib.sha256()
    for model, fields in tiers:
        for row in model.objects.order_by(*fields[:2]).values_list(*fields).iterator(chunk_size=20_000):
            summary.update(repr(row).encode())
    return summary.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--minutes", type=int, default=60, help="raw samples to roll up (whole half hours)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    if args.minutes < 30 or args.minutes % 30:
        parser.error("--minutes must be whole half hours")
    processes.guard()
    with django_on_postgres("gpuadmin-history-fleet-", wait=not args.no_wait):
        return run(args)


def run(args: argparse.Namespace) -> int:
    from django.utils import timezone

    from gpuadmin.fleet.history import partitions, retention

    batch = retention.HOSTS_PER_ROLL_UP_BATCH
    end = retention.coarse_bucket_start(retention.coarse_bucket_of(timezone.now()))
    start = end - timedelta(minutes=args.minutes)
    now = end + timedelta(seconds=retention.SETTLE_SECONDS + 1)
    partitions.ensure_partitions(now)
    began = time.perf_counter()
    fleet(args.hosts, args.gpus, start, args.minutes)
    print(f"{args.hosts:,} hosts x {args.gpus} GPUs, {args.minutes} minutes of raw samples a minute apart "
          f"(made in {time.perf_counter() - began:.1f} s)", file=sys.stderr)
    server_pid = database_server_pid()

    print(f"\n{'case':<9} {'hosts a batch':>13} {'seconds':>8} {'client CPU s':>12} {'PostgreSQL CPU s':>16} "
          f"{'buckets':>8} {'30-min':>7} {'ms a host':>9}  digest")
    results: dict[tuple[str, int], list[Cost]] = {}
    digests: dict[str, set[str]] = {}
    for repeat in range(args.repeats):
        ways = [1, batch] if repeat % 2 == 0 else [batch, 1]
        for case in ("catch-up", "steady"):
            for hosts_per_batch in ways:
                reset(case, end)
                cost = timed(now, hosts_per_batch, server_pid)
                results.setdefault((case, hosts_per_batch), []).append(cost)
                written = digest()
                digests.setdefault(case, set()).add(written)
                took = cost.spent
                print(f"{case:<9} {hosts_per_batch:>13} {took.seconds:>8.2f} "
                      f"{took.cpu_seconds:>12.2f} {took.server_cpu_seconds:>16.2f} "
                      f"{cost.buckets:>8,} {cost.coarse_buckets:>7,} "
                      f"{1000 * took.seconds / args.hosts:>9.2f}  {written}")
    failed = False
    for case, written in digests.items():
        if len(written) != 1:
            print(f"{case}: the two ways wrote different rollups or marks ({', '.join(sorted(written))})")
            failed = True

    print("\nmedian seconds (client + PostgreSQL CPU; of an even count of runs, the slower middle one)")
    for case in ("catch-up", "steady"):
        each = {}
        for hosts_per_batch in (1, batch):
            costs = sorted(results[(case, hosts_per_batch)], key=lambda c: c.spent.seconds)
            middle = costs[len(costs) // 2]
            each[hosts_per_batch] = middle.spent.seconds
            took = middle.spent
            print(f"  {case:<9} {hosts_per_batch:>4} a batch: {took.seconds:7.2f} s "
                  f"({took.cpu_seconds:.2f} + {took.server_cpu_seconds:.2f})")
        print(f"  {case:<9} batched / host by host: {each[batch] / each[1]:.2f}")

    began = time.perf_counter()
    pruned = retention.prune(now)
    print(f"\nprune (nothing past keeping): {time.perf_counter() - began:.2f} s, {pruned.total} rows")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
