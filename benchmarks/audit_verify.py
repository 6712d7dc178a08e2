"""How fast the whole audit chain verifies, and how much memory that takes.

In a throwaway data directory (SQLite) or a throwaway database on a given
PostgreSQL server, append --events audit events with gpuadmin.audit.log.record
(the only writer; kill-request lifecycles of eight events each, with details
shaped like the ones the kill services write), --batch events per transaction.
Then time AuditEvent.objects.verify() --repeats times (median) and run
it once more under tracemalloc for the peak Python memory it allocated, and
time the audit page's later loads: ``verify_after`` over the newest 50 events
(gpuadmin/audit/verified_prefix.py).

It streams the table in chunks, so its peak memory should not grow
with the number of events. Exit status 1 when the chain does not verify.

    python benchmarks/audit_verify.py [--events 30000] [--batch 500] [--repeats 5]
                                      [--database-url postgresql://user@host:port/db]

With --database-url the script creates a database named gpuadmin_bench_<random>
on that server (the role needs CREATEDB), runs there and drops it at the end;
the database named in the URL is only used to connect.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.django_bench import setup_django, throwaway_data_dir  # noqa: E402

GiB = 2**30
PLAN = [{"signal": "SIGINT", "grace_seconds": 30}, {"signal": "SIGTERM", "grace_seconds": 30},
        {"signal": "SIGKILL", "grace_seconds": 10}]
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
EVENTS_PER_REQUEST = 8


# The audit page's incremental check is timed over this many newest events.
PAGE_NEW_EVENTS = 50


@contextlib.contextmanager
def throwaway_postgres_database(url: str) -> Iterator[str]:
    """Create a fresh database on the server of ``url``; yield its URL; drop it afterwards."""
    import psycopg
    from psycopg import sql

    name = f"gpuadmin_bench_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(url)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        from django.db import connections

        with contextlib.suppress(Exception):  # Django may not have got as far as connecting
            connections.close_all()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def lifecycle(request_id: int, start: datetime) -> list[tuple[str, bool, dict[str, Any]]]:
    """The eight events of one kill request that ended well: (action, by the requester/approver, details)."""
    pid = 4000 + request_id % 60000
    ticks = 123_456_789 + request_id
    target = {"pid": pid, "start_time_ticks": ticks, "name": "python", "user": USERS[request_id % len(USERS)]}
    gpu_bytes = (4 + request_id % 60) * GiB
    per_gpu = {f"GPU-{request_id % 8:08x}-0000-4000-8000-{request_id:012x}": gpu_bytes}
    at = [(start + timedelta(seconds=s)).isoformat() for s in (0, 40, 41, 42, 43, 45, 46, 70)]
    return [
        ("requested", True, {
            "reason": f"job {request_id} left its GPU memory behind after the run ended; owner is on leave",
            "plan": PLAN, "include_descendants": True,
            "targets": [{"pid": pid, "start_time_ticks": ticks},
                        {"pid": pid + 1, "start_time_ticks": ticks + 7}],
            "excluded": [], "warnings": ["the process group has another member that is not a target"],
            "gpu_memory_bytes": gpu_bytes, "gpu_memory": f"{gpu_bytes // GiB} GiB",
        }),
        ("approved", True, {
            "self_approved": False, "sigkill_only_allowed": False, "start_deadline": at[1],
            "changes_since_request": {},
        }),
        ("dispatched", False, {"queue": "host.gpu07", "request_id": f"{request_id}-{uuid.uuid4().hex[:12]}"}),
        ("started", False, {"seq": 1, "at": at[3], "detail": "verified 2 targets"}),
        ("signal_sent", False, {**target, "seq": 2, "at": at[4], "detail": "SIGINT via pidfd",
                                "signal": "SIGINT"}),
        ("target_exited", False, {**target, "seq": 3, "at": at[5], "detail": "exited after 1.9 s",
                                  "signal": "SIGINT", "waited_seconds": 1.9}),
        ("finished", False, {"seq": 4, "at": at[6], "detail": "all targets gone",
                             "targets": [{**target, "outcome": "exited"}]}),
        ("memory_released", False, {
            "expected_bytes": gpu_bytes, "released_bytes": gpu_bytes,
            "released": f"{gpu_bytes // GiB} GiB", "expected": f"{gpu_bytes // GiB} GiB",
            "per_gpu": per_gpu, "still_holding": [], "snapshot_taken_at": at[7],
        }),
    ]


def append_events(count: int, batch: int) -> tuple[float, int]:
    """Append ``count`` events; return seconds taken and the events there were before them."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from gpuadmin.audit.log import record, summarize_targets
    from gpuadmin.audit.models import AuditEvent

    users = get_user_model().objects
    requester = users.create_user("bench-requester", password=uuid.uuid4().hex)
    approver = users.create_user("bench-approver", password=uuid.uuid4().hex)
    already = AuditEvent.objects.count()  # creating an account is recorded too (accounts.audit_trail)
    events: list[tuple[int, str, bool, dict[str, Any]]] = []
    start = datetime(2026, 12, 1, tzinfo=UTC)
    request_id = 0
    while len(events) < count:
        request_id += 1
        for action, by_person, details in lifecycle(request_id, start + timedelta(minutes=request_id)):
            events.append((request_id, action, by_person, details))
    del events[count:]

    began = time.perf_counter()
    for first in range(0, count, batch):
        with transaction.atomic():
            for request_id, action, by_person, details in events[first:first + batch]:
                owner = USERS[request_id % len(USERS)]
                targets = [{"pid": 4000 + request_id % 60000, "name": "python", "user": owner},
                           {"pid": 4001 + request_id % 60000, "name": "python", "user": owner}]
                actor = (requester if action == "requested" else approver) if by_person else None
                record(
                    action, actor=actor, kill_request_id=request_id, host_name=f"gpu{request_id % 40:02d}",
                    requester_name=requester.username, approver_name=approver.username,
                    process_users=[owner, "root"] if request_id % 5 == 0 else [owner],
                    targets_summary=summarize_targets(targets),
                    details=details,
                )
    return time.perf_counter() - began, already


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=30000)
    parser.add_argument("--batch", type=int, default=500, help="events per transaction while appending")
    parser.add_argument("--repeats", type=int, default=5, help="timed verify runs (median)")
    parser.add_argument("--database-url", default="", help="a PostgreSQL server to run on (default: SQLite)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    if args.events <= PAGE_NEW_EVENTS:
        # The page's row verifies the newest PAGE_NEW_EVENTS after a prefix: there must be one.
        parser.error(f"--events must be more than {PAGE_NEW_EVENTS}")
    if args.events < 1 or args.batch < 1 or args.repeats < 1:
        parser.error("--events, --batch and --repeats must be at least 1")

    with throwaway_data_dir("gpuadmin-bench-audit-", wait=not args.no_wait):
        if not args.database_url:
            return run(args, "")
        with throwaway_postgres_database(args.database_url) as url:
            return run(args, url)


def run(args: argparse.Namespace, database_url: str) -> int:
    setup_django(database_url)
    from django.db import connection

    from gpuadmin.audit.chain import VERIFY_CHUNK_SIZE
    from gpuadmin.audit.models import AuditEvent

    append_seconds, already = append_events(args.events, args.batch)

    result = AuditEvent.objects.verify()  # warm-up: the first pass also pulls the table into the page cache
    timings = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        result = AuditEvent.objects.verify()
        timings.append(time.perf_counter() - began)
    # The audit page's later loads (gpuadmin/audit/verified_prefix.py): only the
    # events after a prefix verified before, here the newest PAGE_NEW_EVENTS.
    prefix = result.head_sequence - PAGE_NEW_EVENTS
    prefix_hash = AuditEvent.objects.filter(sequence=prefix).values_list("hash", flat=True).get()
    page_timings = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        page_result = AuditEvent.objects.verify_after(prefix, prefix_hash)
        page_timings.append(time.perf_counter() - began)
    tracemalloc.start()
    traced = AuditEvent.objects.verify()
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    median = statistics.median(timings)
    if connection.vendor == "sqlite":
        database = f"SQLite {connection.Database.sqlite_version}"
    else:
        database = f"PostgreSQL {connection.pg_version // 10000}.{connection.pg_version % 10000}"
    print(f"{database}; {args.events} events; verify chunk size {VERIFY_CHUNK_SIZE}; {os.cpu_count()} CPUs")
    print()
    print(f"{'':34}{'seconds':>10}{'events/s':>12}")
    print(f"{'append (record, ' + str(args.batch) + ' per transaction)':34}"
          f"{append_seconds:10.2f}{args.events / append_seconds:12.0f}")
    print(f"{'verify, median of ' + str(args.repeats):34}{median:10.3f}{args.events / median:12.0f}")
    print(f"{'  min / max':34}{min(timings):10.3f} / {max(timings):.3f}")
    page_median = statistics.median(page_timings)
    print(f"{'page: ' + str(PAGE_NEW_EVENTS) + ' new events, median':34}{page_median:10.4f}")
    print(f"peak traced memory during verify: {peak_bytes / 2**20:.1f} MiB")
    print()
    head = f"{result.head_sequence} {(result.head_hash or '-')[:16]}…"
    print(f"{result.summary()} (head {head})")
    counts = {result.events, page_result.events}
    if not (result.ok and traced.ok and page_result.ok and counts == {already + args.events}):
        print(f"FAILED: expected {already + args.events} events verifying OK, got {result.as_dict()}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
