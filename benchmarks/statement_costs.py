"""What PostgreSQL spends on each statement of a steady snapshot (pg_stat_statements).

A throwaway server (``tests/services.py``) with pg_stat_statements loaded (planning tracked too), and
``--hosts`` synthetic hosts (``gpuadmin.fleet.synthetic``) enrolled through the real
path and analyzed, as ``fleet.py`` does; one round ingested to reach the steady
state; then ``--rounds`` rounds, dated a probe interval apart, received by this
process as a central worker would (``receive_snapshot``, its collector settled as a
worker's). Prints, per statement:
the server's time per snapshot planning and executing it, calls, plans and rows
per call (a prepared statement is planned once per connection unless PostgreSQL
finds a plan for each run's values cheaper: then every run is planned); the
backend's whole CPU per snapshot (the rest is the protocol, parsing parameters,
commits); and for each table updated, the share of its updates that stayed on
their page (heap-only: no index touched).

``--updates``: the rounds are what each host's agent sends instead (``snapshot_choice``: an
update of the steady round's full snapshot, figures moving as ``synthetic`` moves them), applied
as central's batch consumer applies them (``receive_snapshot_updates``, a round a batch), and the
figures are per update.

``--timer``: the full snapshots as the agents' timer sends them in a fleet: each measured round
comes after ``GPUADMIN_FULL_SNAPSHOT_SECONDS`` of rounds of updates (applied as with ``--updates``,
not measured), so it finds what minutes of updates left (lives, points, the usage cursor). The
tables' heap-only share is the last measured round's.

    python benchmarks/statement_costs.py [--hosts 100] [--rounds 5] [--updates | --timer]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_on_postgres  # noqa: E402
from benchmarks.fleet import (  # noqa: E402
    ROUND_SECONDS,
    analyze_after_setup,
    database_server_pid,
    enrol_in_the_past,
    process_cpu_seconds,
    round_taken_at,
    settle_worker_process,
)
from benchmarks.snapshot_updates import signed_rounds  # noqa: E402

SHOWN_STATEMENT_CHARS = 90


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    kinds = parser.add_mutually_exclusive_group()
    kinds.add_argument("--updates", action="store_true", help="rounds of snapshot updates, in batches")
    kinds.add_argument("--timer", action="store_true",
                       help="full snapshots each after the full-snapshot period's rounds of updates")
    args = parser.parse_args(argv)
    processes.guard()
    print(f"command: python benchmarks/statement_costs.py --hosts {args.hosts} --rounds {args.rounds}"
          + (" --updates" if args.updates else "") + (" --timer" if args.timer else ""))
    os.environ["GPUADMIN_PROBE_INTERVAL"] = "3600"  # no host goes offline meanwhile
    with django_on_postgres("statement-costs-", wait=False,
                            settings=["shared_preload_libraries=pg_stat_statements",
                                      "pg_stat_statements.track_planning=on"]):
        from django.conf import settings
        from django.db import connection

        from gpuadmin.fleet import synthetic
        from gpuadmin.fleet.intake.ingest import receive_snapshot

        logging.disable(logging.WARNING)
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION pg_stat_statements")
        hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts)
        if args.timer:
            return timer_rounds(hosts, args.rounds)
        enrolled_at = enrol_in_the_past(hosts, rounds_to_come=args.rounds + 1)
        analyze_after_setup()
        if args.updates:
            agents = Path(settings.DATA_DIR) / "agents"
            steady = [m for _, m in signed_rounds(hosts, 1, 1, enrolled_at, agents, full=True)]
            rounds = [steady, *([m for _, m in signed_rounds(hosts, n, 1, enrolled_at, agents, full=False)]
                                for n in range(2, args.rounds + 2))]
        else:
            rounds = [[host.message(n, taken_at=round_taken_at(enrolled_at, n)) for host in hosts]
                      for n in range(1, args.rounds + 2)]
        for message in rounds[0]:  # the steady state: every host's reads now go out with its lock
            receive_snapshot(message)
        settle_worker_process()
        reset_statistics()
        server_pid = database_server_pid()
        client_began, server_began = time.process_time(), process_cpu_seconds(server_pid)
        count = 0
        for messages in rounds[1:]:
            if args.updates:
                apply_updates(messages)
                count += len(messages)
                continue
            for message in messages:
                receive_snapshot(message)
                count += 1
        client_ms = 1000 * (time.process_time() - client_began) / count
        server_ms = 1000 * (process_cpu_seconds(server_pid) - server_began) / count
        report(count, client_ms, server_ms, "update" if args.updates else "snapshot")
    return 0


def timer_rounds(hosts: list[Any], count: int) -> int:
    """``--timer``: ``count`` rounds of the full snapshots the agents' timer sends, each after the
    period's rounds of updates (applied unmeasured); the figures are the full snapshots'."""
    from django.conf import settings

    from gpuadmin.fleet.intake.ingest import receive_snapshot

    between = max(1, round(settings.GPUADMIN_FULL_SNAPSHOT_SECONDS / ROUND_SECONDS))
    enrolled_at = enrol_in_the_past(hosts, rounds_to_come=count * between + 1)
    analyze_after_setup()
    agents = Path(settings.DATA_DIR) / "agents"
    for _, message in signed_rounds(hosts, 1, 1, enrolled_at, agents, full=True):
        receive_snapshot(message)  # every agent's timer starts here
    settle_worker_process()
    server_pid = database_server_pid()
    client_s = server_s = 0.0
    measured = 0
    statements: dict[str, list[float]] = {}  # the full snapshots' only: the updates' are left out
    for number in range(2, count * between + 2):
        sent = signed_rounds(hosts, number, 1, enrolled_at, agents, full=False)
        updates = [message for kind, message in sent if kind != "snapshot"]
        fulls = [message for kind, message in sent if kind == "snapshot"]
        if updates and fulls:
            raise SystemExit("a round mixed full snapshots and updates: the figures would mix them")
        if updates:
            apply_updates(updates)
            continue
        reset_statistics()  # the tables' figures: the last round's
        client_began, server_began = time.process_time(), process_cpu_seconds(server_pid)
        for message in fulls:
            receive_snapshot(message)
        client_s += time.process_time() - client_began
        server_s += process_cpu_seconds(server_pid) - server_began
        measured += len(fulls)
        for query, figures in statement_figures().items():
            before = statements.get(query, [0.0] * len(figures))
            statements[query] = [a + b for a, b in zip(before, figures, strict=True)]
    if measured != count * len(hosts):
        raise SystemExit(f"{measured} full snapshots from the timer, not {count * len(hosts)}")
    report(measured, 1000 * client_s / measured, 1000 * server_s / measured, "snapshot", statements)
    return 0


def reset_statistics() -> None:
    """From now on: the statements' figures (pg_stat_statements) and the tables' (heap-only updates)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_statements_reset()")
        cursor.execute("SELECT pg_stat_reset()")


def apply_updates(messages: list[Any]) -> None:
    """A round of updates applied as central's batch consumer applies them; every one must be done."""
    from gpuadmin.fleet.intake.updates import receive_snapshot_updates

    done: list[int] = []
    receive_snapshot_updates(messages, done=done.append)
    if len(done) != len(messages):
        raise SystemExit(f"{len(messages) - len(done)} updates of a round not done")


def statement_figures() -> dict[str, list[float]]:
    """By statement, [calls, plan ms, run ms, plans, rows] of gpuadmin's statements since the last reset."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_plan_time, total_exec_time, plans, "
            "rows FROM pg_stat_statements WHERE query LIKE '%%fleet_%%' OR query LIKE '%%kills_%%' "
            "OR query LIKE '%%usage_%%' OR query IN ('BEGIN', 'COMMIT')"
        )
        return {query: list(figures) for query, *figures in cursor.fetchall()}


def report(count: int, client_ms: float, server_ms: float, kind: str,
           statements: dict[str, list[float]] | None = None) -> None:
    """The figures; ``statements``: ``statement_figures()``'s (by default, pg_stat_statements' since the
    last reset), printed costliest first."""
    from django.db import connection

    figures = statement_figures() if statements is None else statements
    costliest = sorted(figures.items(), key=lambda item: -(item[1][1] + item[1][2]))
    with connection.cursor() as cursor:
        # The statistics collector reports a little after the fact.
        time.sleep(1)
        cursor.execute(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE n_tup_upd > 0 "
            "ORDER BY n_tup_upd DESC"
        )
        updated = cursor.fetchall()
    print(f"{count} {kind}s; CPU per {kind}: {client_ms:.2f} ms of this process, "
          f"{server_ms:.2f} ms of its PostgreSQL backend")
    print(f"{'plan us':>8} {'run us':>8} {'calls':>6} {'plans':>5} {'rows':>7}  per {kind}; plans and rows "
          "per call")
    total_plan_ms = total_run_ms = 0.0
    for query, (calls, plan_ms, run_ms, plans, rows) in costliest:
        total_plan_ms, total_run_ms = total_plan_ms + plan_ms, total_run_ms + run_ms
        print(f"{1000 * plan_ms / count:8.1f} {1000 * run_ms / count:8.1f} {calls / count:6.2f} "
              f"{plans / max(calls, 1):5.2f} {rows / max(calls, 1):7.1f}  {query[:SHOWN_STATEMENT_CHARS]}")
    print(f"{1000 * total_plan_ms / count:8.1f} {1000 * total_run_ms / count:8.1f} in all (the backend's CPU "
          f"is {1000 * server_ms:.0f} us)")
    print(f"{'table':28}{'updates':>9}{'on their page':>15}")
    for table, updates, hot in updated:
        print(f"{table:28}{updates:9}{100 * hot / updates:14.0f}%")


if __name__ == "__main__":
    sys.exit(main())
