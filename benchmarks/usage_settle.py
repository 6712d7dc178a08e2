"""What settling the usage ledger costs a host: written to LifeUsage and UsageDay, on PostgreSQL.

A host's ``UsageCursor`` keeps running totals between settlings; a settling writes one row per holder
(``LifeUsage``) and per user, owner and GPU model (``UsageDay``). Ingest settles a host every
``GPUADMIN_USAGE_FLUSH_SECONDS`` (900: once in 90 snapshots at a 10 s interval) and at midnight; beat's
``usage.maintain`` (every 300 s) settles hosts gone silent.

On a throwaway PostgreSQL (tests/services.py), --hosts synthetic hosts (``gpuadmin.fleet.synthetic``:
8 GPUs, 200 processes, ~130 GPU holders) enrolled through the real path, then three rounds of full
snapshots ingested (the holders charged). Then ``ledger.flush_all()`` settles every host, timed: ms a
host, of this process's CPU and of its PostgreSQL backend; then once more, when no host has anything
to settle (what beat's run costs for hosts long silent).

    python benchmarks/usage_settle.py [--hosts 200] [--no-wait]
"""

from __future__ import annotations

import logging
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.fleet import database_server_pid, enrolled_fleet, main_over_synthetic_hosts, spent  # noqa: E402

ROUNDS = 3


def main(argv: list[str] | None = None) -> int:
    return main_over_synthetic_hosts(argv, __doc__.splitlines()[0], "gpuadmin-usage-settle-", run)


def run(count: int) -> int:
    from gpuadmin.usage import ledger
    from gpuadmin.usage.models import LifeUsage, UsageCursor, UsageDay

    logging.disable(logging.WARNING)
    enrolled_fleet(count, full_rounds=ROUNDS)
    charged = UsageCursor.objects.exclude(clock_milliseconds=0).count()
    print(f"{count} hosts, {charged} with time charged since their last settling")

    server = database_server_pid()
    with spent(server) as cost:
        settled = ledger.flush_all()
    wall_ms, client_ms, backend_ms = cost.per_ms(settled)
    print(f"settled {settled} hosts ({LifeUsage.objects.count():,} lives, {UsageDay.objects.count():,} "
          f"days written): {wall_ms:.2f} ms a host ({client_ms:.2f} ms of this process's CPU, "
          f"{backend_ms:.2f} of PostgreSQL's)")
    with spent(server) as cost:
        again = ledger.flush_all()
    print(f"again, nothing to settle: {again} settled, {cost.per_ms(count)[0]:.3f} ms a host")
    if settled != charged or again:
        print(f"expected {charged} hosts settled, then none")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
