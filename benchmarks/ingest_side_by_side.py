"""Two versions of ingest at once, side by side: a fair A/B on a machine whose speed drifts.

On the shared 2-CPU VM these benchmarks run on, the same command can give
1.5-1.8 times the rate a few minutes later (benchmarks/README.md). Comparing
two versions by running ``fleet.py`` on each in turn then measures the
machine as much as the code. Here both versions ingest at the same time,
into one PostgreSQL, so whatever slows the machine slows both:

1. one PostgreSQL (``tests/services.py``) and ``--hosts`` synthetic hosts
   (``gpuadmin.fleet.synthetic``), enrolled by this tree's code; the whole run's
   snapshots are dated in the past, 10 s apart (a host's interval), so that
   what depends on time (the lives' once-a-minute refresh) happens as often
   as in a real fleet;
2. two processes, one running this tree's ``gpuadmin``, the other the
   ``--base`` tree's, each with its own connection; in each round every
   host sends one fresh snapshot, and each
   process takes half the hosts, the other half going to the other process;
   halves swap every round, so both versions see every host in every state;
   rounds run in lockstep (no host is ingested by both at once);
3. per version: its process's CPU and its PostgreSQL backend's CPU per
   snapshot (``receive_snapshot``: verify, check the key, validate, store;
   messages are signed before the clock starts);
4. ``--pairs`` times, each pair twice with the processes started in the
   other order.

Both trees must share the database schema: the base tree's migrations must
be this tree's (checked). A base tree is e.g. ``git worktree add /tmp/base
<commit>``; the base tree's own ``benchmarks/fleet.py`` and
``gpuadmin/fleet/synthetic.py`` are used in its process.

    python benchmarks/ingest_side_by_side.py --base /tmp/base [--hosts 100] [--rounds 20] [--pairs 2]

``--no-usage`` instead of ``--base``: this tree against itself with the usage ledger off
(``GPUADMIN_USAGE_LEDGER=0``), the ledger's cost; it then also prints what the ledger keeps per host
and day (its tables' size on disk, after a VACUUM FULL, by row).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402
from benchmarks.fleet import ROUND_SECONDS, enrol_in_the_past  # noqa: E402

# What every child of an A/B run (this script's, ingest_instructions.py's) does first, inside the tree
# it measures, whose own benchmarks may be older than this file. Its arguments: the tree, the
# database URL, the data directory (the demo hosts' keys), hosts, processes per snapshot, when round
# 1 was taken (a Unix time), the seconds between rounds; then the child's own (``more``).
CHILD_PRELUDE = r"""
import json, logging, sys, time
from datetime import UTC, datetime
from pathlib import Path
tree, url, data_dir, hosts, processes, first_at, round_seconds, *more = sys.argv[1:]
hosts, processes, first_at, round_seconds = int(hosts), int(processes), float(first_at), float(round_seconds)
sys.path.insert(0, tree)
from benchmarks.django_bench import setup_django
from benchmarks.fleet import database_server_pid, process_cpu_seconds
setup_django(url)
from django.db import connection
from gpuadmin.fleet import synthetic
from gpuadmin.fleet.intake.ingest import receive_snapshot
logging.disable(logging.WARNING)
demo_hosts = synthetic.demo_hosts(Path(data_dir), hosts, processes=processes)
def message(host, r):  # the host's round r (from 1), taken round_seconds after round r - 1
    return host.message(r, taken_at=datetime.fromtimestamp(first_at + round_seconds * (r - 1), UTC))
def ingest(message):
    if receive_snapshot(message) is None:
        raise SystemExit("a snapshot was not stored")
try:
    from benchmarks.fleet import settle_worker_process
except ImportError:  # a tree older than it: its workers did nothing at start
    settle_worker_process = lambda: None  # noqa: E731
"""


def child_command(body: str, tree: Path, url: str, *, data_dir: str, hosts: int, processes: int,
                  first_at: float, more: Sequence[object] = ()) -> list[str]:
    """The command of a child that runs ``CHILD_PRELUDE``, then ``body``, in ``tree``."""
    return [sys.executable, "-c", CHILD_PRELUDE + body, str(tree), url, data_dir, str(hosts), str(processes),
            str(first_at), str(ROUND_SECONDS), *map(str, more)]


# One version's process: ingests its half of each round's snapshots when told to, then reports.
_CHILD = r"""
rounds, parity = map(int, more)
connection.ensure_connection()
server_pid = database_server_pid()
halves = [[message(h, r) for n, h in enumerate(demo_hosts) if (n + r + parity) % 2 == 0]
          for r in range(1, rounds + 1)]
settle_worker_process()
print("ready", flush=True)
client = server = 0.0
count = 0
for messages in halves:
    sys.stdin.readline()
    for one in messages:
        client_before, server_before = time.process_time(), process_cpu_seconds(server_pid)
        ingest(one)
        client += time.process_time() - client_before
        server += process_cpu_seconds(server_pid) - server_before
        count += 1
    print("done", flush=True)
print(json.dumps({"snapshots": count, "client": client, "server": server}), flush=True)
"""
def migrations(tree: Path) -> set[str]:
    return {str(path.relative_to(tree)) for path in tree.glob("gpuadmin/*/migrations/0*.py")}


def run_together(trees: list[Path], url: str, hosts: int, rounds: int, *, data_dir: str,
                 first_at: float, environments: Sequence[dict[str, str]] = ()) -> list[dict[str, float]]:
    """Both trees ingesting ``rounds`` rounds at once, the first taken at ``first_at`` (a Unix time),
    the others ``ROUND_SECONDS`` apart; each tree's totals, in ``trees`` order. ``environments``: what
    each child's environment adds, in ``trees`` order."""
    added = list(environments) or [{} for _ in trees]
    children = [
        subprocess.Popen(child_command(_CHILD, tree, url, data_dir=data_dir, hosts=hosts, processes=200,
                                       first_at=first_at, more=(rounds, parity)),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **added[parity]})
        for parity, tree in enumerate(trees)
    ]
    try:
        for child in children:
            if child.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise SystemExit(f"{child.args[3]} did not start")
        for _ in range(rounds):
            for child in children:
                child.stdin.write("go\n")  # type: ignore[union-attr]
                child.stdin.flush()  # type: ignore[union-attr]
            for child in children:
                if child.stdout.readline().strip() != "done":  # type: ignore[union-attr]
                    raise SystemExit("a round failed")
        return [json.loads(child.stdout.readline()) for child in children]  # type: ignore[union-attr]
    finally:
        for child in children:
            child.stdin.close()  # type: ignore[union-attr]
            child.wait(timeout=60)


def ledger_size(hosts: int) -> None:
    """What the usage ledger keeps per host and day, in bytes on disk (its tables after a VACUUM FULL,
    indexes included, by row): its day rows (one per user, owner and GPU model a host had that day),
    plus one row per process life and GPU it held, whatever the life's length (the synthetic hosts'
    holders live for days: they cost their row once)."""
    from django.db import connection

    from gpuadmin.usage import ledger
    from gpuadmin.usage.models import LifeUsage, UsageCursor, UsageDay

    ledger.flush_all()
    with connection.cursor() as cursor:
        sizes = {}
        for model in (UsageDay, LifeUsage, UsageCursor):
            table = model._meta.db_table
            cursor.execute(f"VACUUM FULL {table}")
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            sizes[model] = cursor.fetchone()[0]
    days = UsageDay.objects.values("day").distinct().count() or 1
    day_rows, life_rows = UsageDay.objects.count(), LifeUsage.objects.count()
    per_day_row = sizes[UsageDay] / max(1, day_rows)
    per_life_row = sizes[LifeUsage] / max(1, life_rows)
    host_day_kib = day_rows / hosts / days * per_day_row / 1024
    cursor_kib = sizes[UsageCursor] / hosts / 1024
    print(f"ledger: {day_rows} day rows over {days} day(s), {per_day_row:.0f} B each; {life_rows} rows of a "
          f"life and GPU, {per_life_row:.0f} B each; cursors {cursor_kib:.1f} KB a host "
          f"(overwritten, not added). Per host-day: {host_day_kib:.1f} KB of day rows + {per_life_row:.0f} B "
          f"per life and GPU started that day")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    versus = parser.add_mutually_exclusive_group(required=True)
    versus.add_argument("--base", type=Path, help="the other version's checkout")
    versus.add_argument("--no-usage", action="store_true",
                        help="this tree against itself with the usage ledger off (its cost)")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args(argv)
    processes.guard()
    # Without the ledger, the "base" is this tree with GPUADMIN_USAGE_LEDGER=0: the ratio is its cost.
    base = REPO if args.no_usage else args.base.resolve()
    if migrations(base) != migrations(REPO):
        raise SystemExit(f"{base} has other migrations than {REPO}: the two cannot share a database")
    versus = "--no-usage" if args.no_usage else f"--base {args.base}"
    print(f"command: python benchmarks/ingest_side_by_side.py {versus} --hosts {args.hosts} "
          f"--rounds {args.rounds} --pairs {args.pairs}")
    os.environ["GPUADMIN_PROBE_INTERVAL"] = "3600"  # no host goes offline meanwhile
    from tests import services

    ratios: list[float] = []
    with throwaway_data_dir("side-by-side-", wait=False), services.postgres_server() as server:
        setup_django(server.url)
        from django.conf import settings
        from django.db import connections

        from gpuadmin.fleet import synthetic

        logging.disable(logging.WARNING)
        # Every round of the run 10 s after the one before, the last one a minute ago.
        runs = 2 * args.pairs
        hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts)
        enrolled_at = enrol_in_the_past(hosts, rounds_to_come=runs * args.rounds).timestamp()
        connections.close_all()
        run = 0
        print(f"{args.hosts} hosts x 8 GPUs, 200 processes each; CPU per snapshot (ms): client + PostgreSQL")
        for pair in range(args.pairs):
            for first in ("this", "base"):
                # "this" and "base" by name: with --no-usage both are this tree, apart by environment.
                names = ["this", "base"] if first == "this" else ["base", "this"]
                trees = [REPO if name == "this" else base for name in names]
                ledger_off = {"GPUADMIN_USAGE_LEDGER": "0"} if args.no_usage else {}
                environments = [ledger_off if name == "base" else {} for name in names]
                first_at = enrolled_at + ROUND_SECONDS * (1 + run * args.rounds)
                run += 1
                run_totals = run_together(trees, server.url, args.hosts, args.rounds,
                                          data_dir=str(settings.DATA_DIR), first_at=first_at,
                                          environments=environments)
                totals = dict(zip(names, run_totals, strict=True))
                line = []
                per_snapshot = {}
                for name in ("this", "base"):
                    total = totals[name]
                    n = total["snapshots"]
                    client, database = 1000 * total["client"] / n, 1000 * total["server"] / n
                    per_snapshot[name] = client + database
                    line.append(f"{name} {client:.2f} + {database:.2f} = {client + database:.2f}")
                ratios.append(per_snapshot["this"] / per_snapshot["base"])
                print(f"pair {pair + 1}, {first} started first: {'; '.join(line)}; "
                      f"this/base {ratios[-1]:.3f}")
        if args.no_usage:
            ledger_size(args.hosts)
    print(f"this/base, CPU per snapshot: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
