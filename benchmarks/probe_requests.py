"""Central's cost of asking hosts for probes (beat's ``schedule_probes``, every interval, one per host).

A redis-server of its own (tests/services.py's ``redis_server``); ``--hosts`` probe requests sent by
``gpuadmin.sending.request_probe`` one at a time (each builds its message and takes the pool's
producer), then the same through ``request_probes`` (what ``fleet.probes.send_due_probes`` sends with:
the round's message built once, each host's copy published on one producer), side by side,
``--repeats`` times each. Prints the CPU milliseconds of this process per request (the
publish's own share included) and checks that every request reached its host's queue.

``--postgres``: then the whole round as beat's ``schedule_probes`` runs it
(``fleet.probes.send_due_probes``) on a throwaway PostgreSQL holding ``--hosts`` hosts, all heard
from a minute ago but one in ten offline for a day: the hosts read, every probe sent, the bookkeeping
written. CPU milliseconds per host of this process and of its PostgreSQL backend, and the rows the
round wrote (PostgreSQL's count).

    python benchmarks/probe_requests.py [--hosts 2000] [--repeats 3] [--postgres] [--no-wait]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_with_redis  # noqa: E402
from tests import services  # noqa: E402


def measure(args: argparse.Namespace) -> None:
    from gpuadmin.celery import app, host_queue
    from gpuadmin.sending import request_probe, request_probes

    names = [f"gpu{n:05}" for n in range(args.hosts)]

    def one_by_one() -> None:
        for name in names:
            request_probe(name)

    def one_message() -> None:
        request_probes(names)

    request_probe("warm-up")
    figures: dict[str, list[float]] = {"request_probe, one by one": [],
                                       "request_probes, one message a round": []}
    for _ in range(args.repeats):
        for label, send in zip(figures, (one_by_one, one_message), strict=True):
            began = time.process_time()
            send()
            figures[label].append(1000 * (time.process_time() - began) / len(names))
    with app.connection_for_write() as connection:
        client = connection.default_channel.client
        queued = [client.llen(host_queue(name)) for name in names]
    if queued != [2 * args.repeats] * len(names):
        raise SystemExit(f"probe requests lost: {sum(queued)} queued of {2 * args.repeats * len(names)}")
    print(f"{'how':38}{'CPU ms per request (median, min-max)':>40}")
    for label, values in figures.items():
        print(f"{label:38}{spread(values):>33}")


OFFLINE_EVERY = 10  # --postgres: one host in ten offline for a day


def measure_rounds(args: argparse.Namespace) -> None:
    """--postgres: ``send_due_probes`` as beat runs it, ``--repeats`` rounds an interval apart."""
    from datetime import timedelta

    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from benchmarks.fleet import database_server_pid, process_cpu_seconds
    from gpuadmin.fleet.models import Host
    from gpuadmin.fleet.probes import send_due_probes

    now = timezone.now()
    enrolled_at = now - timedelta(days=2)
    Host.objects.bulk_create([
        Host(name=f"rack{n:05}", first_seen_at=enrolled_at, key_accepted_at=enrolled_at,
             last_seen_at=now - timedelta(days=1 if n % OFFLINE_EVERY == 0 else 0, minutes=1))
        for n in range(args.hosts)], batch_size=1000)
    backend = database_server_pid()
    interval = timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)

    def rows_written() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = %s",
                           [Host._meta.db_table])
            return int(cursor.fetchone()[0])

    ours, theirs, written = [], [], []
    for n in range(args.repeats):
        before, before_backend, updated = time.process_time(), process_cpu_seconds(backend), rows_written()
        sent = send_due_probes(now + n * interval)
        ours.append(1000 * (time.process_time() - before) / args.hosts)
        theirs.append(1000 * (process_cpu_seconds(backend) - before_backend) / args.hosts)
        written.append(rows_written() - updated)
    print(f"\nthe round (send_due_probes), {args.hosts} hosts on PostgreSQL, {args.repeats} rounds: "
          f"CPU ms per host, this process {spread(ours)}, its backend {spread(theirs)}; probes sent in the "
          f"last round {len(sent)}; host rows written per round {', '.join(map(str, written))}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--postgres", action="store_true",
                        help="then the whole round (send_due_probes) on a throwaway PostgreSQL")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    processes.guard()
    print("command: python benchmarks/probe_requests.py " + " ".join(sys.argv[1:] if argv is None else argv))
    with contextlib.ExitStack() as stack:
        database = stack.enter_context(services.postgres_server()).url if args.postgres else None
        stack.enter_context(django_with_redis("gpuadmin-bench-probes-", wait=not args.no_wait,
                                              database_url=database))
        print(f"{args.hosts} hosts, {args.repeats} rounds each way, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")
        measure(args)
        if args.postgres:
            measure_rounds(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
