"""Full snapshots against snapshot updates (issue 36): central's cost and the bytes of each kind.

For each database (SQLite in a throwaway data directory; PostgreSQL started by tests/services.py's
``postgres_server``, fsync off as in the tests), with ``gpuadmin.fleet.synthetic``'s hosts (the same
processes every round, about one GPU holder in ten moving its memory):

1. enrolment: round 0 of every host (signed snapshot, key accepted, stored);
2. full: ``--rounds`` rounds of every host sent as full snapshots (the agent's choice with
   "central asked for one"), received by ``ingest.receive_snapshot``;
3. updates: ``--rounds`` more rounds as the agent chooses them (``agent.snapshot_choice.choose``,
   its state in a file per host), received by the task's function for their kind;
4. with ``--batch N``: ``--rounds`` more rounds of updates, N at a time through
   ``updates.receive_snapshot_updates``, as central's batch consumer takes them.

Each message is signed before the clock starts (the agents' work, not central's); no broker: this is
central's cost per message, in one process. Per kind: messages per second, CPU milliseconds per
message of the ingest process and of the PostgreSQL backend serving it (0 on SQLite: its work is the
process's own), and bytes per message as sent (the signed envelope). Then the history written by the
update rounds per host-day (PostgreSQL: the growth of the history tables' relations, partitions
included, over the hosts and the seconds the rounds cover; raw samples and points before rollups),
and the raw sample rows they wrote per update. Raw samples are written when a figure moves past its
step and at least every GPUADMIN_HISTORY_RAW_SECONDS (60): rounds that span less than that leave the
heartbeat's rows out, so measure history with ``--rounds 6`` or more.

``--profile N``: cProfile of the update rounds (the batched ones with ``--batch``; the full rounds
with ``--profile-full``) in CPU time (their CPU figures are then the profiler's), the N costliest
functions by cumulative and by own time.

    python benchmarks/snapshot_updates.py [--hosts 200] [--gpus 8] [--processes 200] [--rounds 3]
                                          [--database sqlite|postgresql|both] [--no-wait] [--profile N]
                                          [--profile-full] [--batch N]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import multiprocessing
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402
from benchmarks.fleet import (  # noqa: E402
    analyze_after_setup,
    database_server_pid,
    process_cpu_seconds,
    settle_worker_process,
)

ROUND_SECONDS = 10
HISTORY_TABLES = ("fleet_gpusample", "fleet_hostsample", "fleet_processpoint", "fleet_processlife",
                  "fleet_gpurollup", "fleet_hostrollup")


def history_bytes() -> int | None:
    """The history tables' size on disk, partitions and indexes included (PostgreSQL; None elsewhere)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
        cursor.execute("SELECT COALESCE(sum(pg_total_relation_size(t.relid)), 0) "
                       "FROM unnest(%s::text[]) AS n, LATERAL pg_partition_tree(n::regclass) AS t",
                       [list(HISTORY_TABLES)])
        return int(cursor.fetchone()[0])


def signed_rounds(hosts: list[Any], first: int, count: int, enrolled_at: datetime, state_dir: Path, *,
                  full: bool) -> list[tuple[str, dict[str, Any]]]:
    """(kind, message) of ``count`` rounds of every host from round ``first``, as each agent chooses."""
    from django.conf import settings

    from gpuadmin.agent.snapshot_choice import Limits, choose

    limits = Limits(full_every_seconds=settings.GPUADMIN_FULL_SNAPSHOT_SECONDS,
                    snapshot_max_bytes=settings.GPUADMIN_SNAPSHOT_MAX_BYTES,
                    update_max_bytes=settings.GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES,
                    step_bytes=settings.GPUADMIN_HISTORY_PROCESS_STEP_BYTES)
    messages = []
    for number in range(first, first + count):
        taken_at = enrolled_at + timedelta(seconds=ROUND_SECONDS * number)
        for host in hosts:
            choice = choose(host.document(number, taken_at=taken_at), host.key,
                            state_path=state_dir / f"{host.name}.json", now=taken_at.timestamp(),
                            limits=limits, full_requested=full)
            messages.append((choice.kind.value, choice.message))
    return messages


def raw_sample_rows() -> int:
    from gpuadmin.fleet.models import GpuSample, HostSample

    return GpuSample.objects.count() + HostSample.objects.count()


def receive_all(messages: list[tuple[str, dict[str, Any]]], profiler: cProfile.Profile | None = None,
                profiled: str = "snapshot_update") -> dict[str, list[float]]:
    """Receive each message as its task would; per kind: [count, wall s, CPU s, server CPU s, bytes,
    median CPU s of one message] (the median: what the others' bursts on a shared machine move least).
    ``profiler``: enabled around each message of the ``profiled`` kind received."""
    from gpuadmin.fleet.intake.ingest import receive_snapshot
    from gpuadmin.fleet.intake.updates import receive_snapshot_update
    from gpuadmin.wire.signing import canonical_json

    receive = {"snapshot": receive_snapshot, "snapshot_update": receive_snapshot_update}
    settle_worker_process()
    server = database_server_pid()
    figures: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0])
    each: dict[str, list[float]] = defaultdict(list)
    for kind, message in messages:
        size = len(canonical_json(message))
        server_began = process_cpu_seconds(server)
        profiling = profiler is not None and kind == profiled
        began, cpu_began = time.perf_counter(), time.process_time()
        if profiling:
            profiler.enable()
        stored = receive[kind](message)
        if profiling:
            profiler.disable()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        if stored is None:
            raise RuntimeError("a synthetic host's message was not stored")
        row = figures[kind]
        row[0] += 1
        row[1] += wall
        row[2] += cpu
        row[3] += process_cpu_seconds(server) - server_began
        row[4] += size
        each[kind].append(cpu)
    return {kind: [*row, statistics.median(each[kind])] for kind, row in figures.items()}


def receive_batches(messages: list[tuple[str, dict[str, Any]]], batch: int,
                    profiler: cProfile.Profile | None = None) -> dict[str, list[float]]:
    """As ``receive_all``, but the updates as central's batch consumer takes them: ``batch`` at a time
    through ``receive_snapshot_updates`` (a full snapshot among them alone, before its batch); the
    median is of a batch's CPU per message."""
    from gpuadmin.fleet.intake.ingest import receive_snapshot
    from gpuadmin.fleet.intake.updates import receive_snapshot_updates
    from gpuadmin.wire.signing import canonical_json

    settle_worker_process()
    server = database_server_pid()
    figures: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0])
    each: dict[str, list[float]] = defaultdict(list)
    pending: list[dict[str, Any]] = []

    def receive(kind: str, group: list[dict[str, Any]]) -> None:
        done: list[int] = []
        server_began = process_cpu_seconds(server)
        profiling = profiler is not None and kind == "snapshot_update"
        began, cpu_began = time.perf_counter(), time.process_time()
        if profiling:
            profiler.enable()
        if kind == "snapshot":
            if receive_snapshot(group[0]) is None:
                raise RuntimeError("a synthetic host's snapshot was not stored")
        else:
            receive_snapshot_updates(group, done=done.append)
        if profiling:
            profiler.disable()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        if kind != "snapshot" and len(done) != len(group):
            raise RuntimeError("a batch's updates were not all done")
        row = figures[kind]
        row[0] += len(group)
        row[1] += wall
        row[2] += cpu
        row[3] += process_cpu_seconds(server) - server_began
        row[4] += sum(len(canonical_json(message)) for message in group)
        each[kind].append(cpu / len(group))

    for kind, message in messages:
        if kind == "snapshot":
            receive(kind, [message])
            continue
        pending.append(message)
        if len(pending) == batch:
            receive(kind, pending)
            pending = []
    if pending:
        receive("snapshot_update", pending)
    return {kind: [*row, statistics.median(each[kind])] for kind, row in figures.items()}


def report(phase: str, figures: dict[str, list[float]]) -> None:
    for kind, (count, wall, cpu, server_cpu, size, median_cpu) in sorted(figures.items()):
        print(f"{phase:8}{kind:17}{int(count):9}{count / wall:11.0f}{1000 * cpu / count:10.2f}"
              f"{1000 * median_cpu:8.2f}{1000 * server_cpu / count:10.2f}{size / count:12.0f}", flush=True)


def run_database(args: argparse.Namespace, vendor: str) -> None:
    from django.conf import settings

    from gpuadmin.fleet import synthetic

    logging.disable(logging.WARNING)
    hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts, gpus=args.gpus, processes=args.processes)
    print(f"\n== {vendor}: {args.hosts} hosts x {args.gpus} GPUs, {args.processes} processes each, "
          f"{args.rounds} rounds of each kind, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} ==", flush=True)
    enrolled_at = datetime.now(UTC) - timedelta(seconds=60 + ROUND_SECONDS * 3 * args.rounds)
    for host in hosts:
        synthetic.send(host, 0, taken_at=enrolled_at)
    analyze_after_setup()
    print(f"{'phase':8}{'kind':17}{'messages':>9}{'per s':>11}{'CPU ms':>10}{'p50':>8}{'DB CPU ms':>10}"
          f"{'bytes':>12}")
    with tempfile.TemporaryDirectory(prefix="gpuadmin-agent-states-") as states:
        # CPU time, not wall: what is spent here, not the waits on the database server.
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        profiled = "full" if args.profile_full else "batched" if args.batch else "updates"

        def profiler_of(phase: str) -> cProfile.Profile | None:
            return profiler if phase == profiled else None

        def label(phase: str) -> str:
            return phase if profiler_of(phase) is None else phase + "*"

        full = signed_rounds(hosts, 1, args.rounds, enrolled_at, Path(states), full=True)
        report(label("full"), receive_all(full, profiler_of("full"), "snapshot"))
        updates = signed_rounds(hosts, 1 + args.rounds, args.rounds, enrolled_at, Path(states), full=False)
        before, rows_before = history_bytes(), raw_sample_rows()
        received = receive_all(updates, profiler_of("updates"))
        report(label("updates"), received)
        after, rows_after = history_bytes(), raw_sample_rows()
        if args.batch:
            batched = signed_rounds(hosts, 1 + 2 * args.rounds, args.rounds, enrolled_at, Path(states),
                                    full=False)
            report(label("batched"), receive_batches(batched, args.batch, profiler_of("batched")))
    if profiler is not None:
        print("* under the profiler")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    update_count = int(received.get("snapshot_update", [0])[0])
    if update_count:
        per_update = (rows_after - rows_before) / update_count
        print(f"raw sample rows written by the update rounds: {per_update:.2f} per update "
              f"({args.gpus} GPUs and the host)")
    if before is None or after is None:
        print("history per host-day: measured on PostgreSQL only")
        return
    host_days = args.hosts * args.rounds * ROUND_SECONDS / 86400
    print(f"history written by the update rounds: {(after - before) / host_days / 1e6:.1f} MB per host-day "
          "(raw samples and points, before rollups and the raw rows' pruning)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every host of each kind (10 s apart)")
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    parser.add_argument("--batch", type=int, default=0, metavar="N",
                        help="then as many rounds of updates again, N at a time, as central's batch "
                             "consumer takes them (receive_snapshot_updates)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the update rounds: the N costliest functions")
    parser.add_argument("--profile-full", action="store_true",
                        help="with --profile: profile the full rounds instead")
    args = parser.parse_args(argv)
    processes.guard()
    given = sys.argv[1:] if argv is None else argv
    print("command: python benchmarks/snapshot_updates.py " + " ".join(given))
    for vendor in ("sqlite", "postgresql"):
        if args.database in (vendor, "both"):
            # Its own process: Django is set up once per process, on one database.
            child = multiprocessing.get_context("fork").Process(target=_run_child, args=(args, vendor))
            child.start()
            child.join()
            if child.exitcode:
                return child.exitcode
    return 0


def _run_child(args: argparse.Namespace, vendor: str) -> None:
    with throwaway_data_dir(f"gpuadmin-bench-updates-{vendor}-", wait=not args.no_wait):
        if vendor == "sqlite":
            setup_django()
            run_database(args, vendor)
            return
        from tests import services

        with services.postgres_server() as server:
            setup_django(server.url)
            run_database(args, vendor)


if __name__ == "__main__":
    sys.exit(main())
