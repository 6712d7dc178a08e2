"""A fleet on one small server: ingest rate, and the fleet page at fleet size (issue 9).

For each database (SQLite in a throwaway data directory; PostgreSQL started
by tests/services.py's ``postgres_server``, fsync off as in the tests), with
``gpuadmin.fleet.synthetic``'s synthetic hosts (the generator behind
``manage.py demo_fleet``):

1. enrolment: round 0 of every host through ``synthetic.send`` (signed snapshot ->
   key offered -> accepted by fingerprint -> stored);
2. steady ingest: a fresh signed snapshot per host, received by
   ``ingest.receive_snapshot`` (what the central worker's ``ingest_snapshot``
   task runs: verify the signature, check the host's key, validate, store in
   one transaction under the host's row lock), first by one process, then by
   ``--workers`` processes at once, each taking its share of the first
   ``--rate-hosts`` hosts, ``--rounds`` snapshots each (``--skip-ingest``:
   not measured). Each process signs its messages before the clock starts
   (signing is the agents' work, not central's) and the broker is left out:
   this is central's cost per snapshot. Enrolment and the rounds are dated in
   the past, one probe interval (10 s) apart, so that what depends on time
   (the lives' once-a-minute refresh) comes as often as in a fleet; on
   PostgreSQL the tables are analyzed after enrolment, as autovacuum would;
3. the fleet page through django.test.Client as a logged-in superuser (the
   whole request path, no network): full page, a page filtered by finding
   kind, page 20, and the htmx poll when nothing changed (204), after one
   host's new snapshot, and after every host of the page sent one; median, p95,
   bytes and queries. The page again with the process's rendered rows
   forgotten before each request ("no row kept": every row rendered, as when
   every host on it changed what its row shows). "CPU ms": the median of this
   process's CPU time per request (the whole server side on SQLite; not
   PostgreSQL's own work), which a shared, loaded machine inflates far less
   than the wall clock. The probe interval is set to an hour, so that no host
   goes offline (and changes its row) while the pages are measured.

    python benchmarks/fleet.py [--hosts 1000] [--gpus 8] [--processes 200] [--workers 2]
                               [--rate-hosts 300] [--rounds 1] [--repeats 30]
                               [--database sqlite|postgresql|both]
                               [--over tcp|socket] [--history-minutes M] [--no-wait]
                               [--skip-ingest] [--skip-pages] [--profile N] [--stages N]

``--history-minutes M``: before the rates, each host gets M minutes of host
samples (one per 10 s, its own counts), as a fleet that has run that long has:
the PID trend of a host with zombies reads the last hour of them (default 0);
``--over``: how the processes reach PostgreSQL, TCP on 127.0.0.1 (the default)
or the server's Unix socket (a database on central's own machine, as
deploy/central.env.example offers);

``--profile N`` adds, after the rates, the queries of one steady-state snapshot
(by kind of statement) and a cProfile of N more received by one process;
``--stages N`` the wall and CPU milliseconds per snapshot of each step of ingest (the
functions ``STAGES`` names, each timed where ingest calls it; nested steps
are inside their callers' figures), over N more snapshots received by one
process without a profiler;
``--skip-ingest`` leaves out part 2 (enrolment and the pages only),
``--skip-pages`` part 3.

``--clone-hosts N`` (issue 36 item 3: the pages at 10,000 hosts) adds N hosts after the rates, before the
pages, copied from the ingested ones (host row, GPUs, open findings, the live process lives that hold GPU
memory or were orphaned), each then summarised by ``fleet.summary.refresh_host_summary``, the function
ingest calls (a shortcut on a shared two-core machine: 9,000 clones take ~165 s, enrolling them through
ingest at the 30-39 hosts/s measured here ~5 minutes). One
clone in 50 was last seen a day ago (offline). The pages part then also times the attention filter, the
"most free GPUs" order, page 2, the attention strip and the nav count (each as a function: the strip's
three reads, the count's two) and an ingested host's page.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks import processes  # noqa: E402
from benchmarks.django_bench import django_on_postgres, setup_django, throwaway_data_dir  # noqa: E402
from benchmarks.pages import percentile  # noqa: E402

WARM_UP_REQUESTS = 2
# A host's probe interval: a round's snapshots are taken this long after the round before.
ROUND_SECONDS = 10
POLLER = re.compile(r'<div id="fleet-poll" hidden hx-get="([^"]+)"')


@dataclass
class Timed:
    label: str
    median_ms: float
    p95_ms: float
    cpu_median_ms: float  # this process's CPU time: what a loaded machine's waits do not inflate
    status: int
    bytes: int
    queries: int


def _ingest_share(hosts: list[Any], rounds: list[tuple[int, datetime]], barrier: Any, results: Any) -> None:
    """One central worker process: sign its hosts' snapshots of every round, wait for the others,
    receive them all, round after round."""
    from django.db import connections

    from gpuadmin.fleet.intake.ingest import receive_snapshot

    connections.close_all()  # never share the parent's connection
    messages = [host.message(number, taken_at=taken_at) for number, taken_at in rounds for host in hosts]
    settle_worker_process()
    server_pid = database_server_pid()
    barrier.wait()
    cpu_began, server_cpu_began = time.process_time(), process_cpu_seconds(server_pid)
    for message in messages:
        if receive_snapshot(message) is None:
            raise RuntimeError("a demo host was not accepted")
    server_cpu = process_cpu_seconds(server_pid) - server_cpu_began
    results.put((len(messages), time.process_time() - cpu_began, server_cpu))
    connections.close_all()


def settle_worker_process() -> None:
    """What a central worker process does when it starts (gpuadmin/celery.py), where the tree being
    measured does anything: its collector's settings are part of ingest's cost."""
    from gpuadmin import celery

    settle = getattr(celery, "settle_garbage_collector", None)  # an older tree (ingest_side_by_side)
    if settle is not None:
        settle()


def database_server_pid() -> int | None:
    """The PostgreSQL backend process serving this process's connection (on this machine); None on
    SQLite, whose work is this process's own."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat); 0 for None."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Spent:
    """What a stretch of work took: wall seconds, this process's CPU seconds, its PostgreSQL backend's."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    server_cpu_seconds: float = 0.0

    def per_ms(self, count: int) -> tuple[float, float, float]:
        """The three in milliseconds per one of ``count`` (at least one)."""
        count = max(count, 1)
        return (1000 * self.seconds / count, 1000 * self.cpu_seconds / count,
                1000 * self.server_cpu_seconds / count)


@contextmanager
def spent(server_pid: int | None) -> Iterator[Spent]:
    """``with spent(server) as cost:``: ``cost`` holds what the block took once it is done."""
    cost = Spent()
    began, cpu, server = time.perf_counter(), time.process_time(), process_cpu_seconds(server_pid)
    yield cost
    cost.seconds = time.perf_counter() - began
    cost.cpu_seconds = time.process_time() - cpu
    cost.server_cpu_seconds = process_cpu_seconds(server_pid) - server


def ingest_rounds(hosts: list[Any], rounds: list[tuple[int, datetime]],
                  workers: int) -> tuple[float, float, float]:
    """Snapshots per second of ``rounds`` (round number, taken at) of every host, received by
    ``workers`` processes at once, each with its share of the hosts; and the CPU milliseconds per
    snapshot of the receiving processes and of the PostgreSQL backends serving them (0 on SQLite):
    on a machine others load too, the figures that move least, and their sum bounds the rate the
    machine's cores allow."""
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    shares = [hosts[n::workers] for n in range(workers)]
    processes = [context.Process(target=_ingest_share, args=(share, rounds, barrier, results))
                 for share in shares]
    for process in processes:
        process.start()
    barrier.wait()
    began = time.perf_counter()
    shares_done = [results.get() for _ in processes]
    elapsed = time.perf_counter() - began
    received = sum(count for count, _, _ in shares_done)
    cpu_seconds = sum(cpu for _, cpu, _ in shares_done)
    server_cpu_seconds = sum(server_cpu for _, _, server_cpu in shares_done)
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"an ingest process exited with {process.exitcode}")
    if received != len(hosts) * len(rounds):
        raise RuntimeError(f"received {received} of {len(hosts) * len(rounds)} snapshots")
    return received / elapsed, 1000 * cpu_seconds / received, 1000 * server_cpu_seconds / received


def profile_ingest(hosts: list[Any], round_number: int, count: int) -> None:
    """Queries of one snapshot, then where ``count`` snapshots' time goes (one process, cProfile)."""
    import cProfile
    import pstats
    from collections import Counter

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpuadmin.fleet.intake.ingest import receive_snapshot

    profiled = hosts[:count]
    messages = [host.message(round_number) for host in profiled]
    with CaptureQueriesContext(connection) as queries:
        receive_snapshot(profiled[0].message(round_number - 1))
    kinds = Counter(q["sql"].split(None, 1)[0].upper() for q in queries.captured_queries)
    print(f"queries for one steady-state snapshot: {len(queries)} "
          f"({', '.join(f'{n} {kind}' for kind, n in sorted(kinds.items()))})")
    for q in queries.captured_queries:
        print(f"  {q['time']:>6}s  {q['sql'][:150]}")
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for message in messages[1:]:
        receive_snapshot(message)
    profiler.disable()
    print(f"profiled: {1000 * (time.perf_counter() - began) / max(1, len(messages) - 1):.1f} ms per snapshot "
          "(under the profiler)")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


# The steps of ingest timed by --stages: (module, function), each replaced where it is looked up.
STAGES = [
    ("gpuadmin.fleet.intake.ingest", "open_envelope"),
    ("gpuadmin.fleet.intake.ingest", "parse_snapshot"),
    ("gpuadmin.fleet.intake.trust", "admit"),
    ("gpuadmin.fleet.intake.ingest", "process_rows"),
    ("gpuadmin.fleet.intake.ingest", "_update_host"),
    ("gpuadmin.fleet.intake.ingest", "_store_latest"),
    ("gpuadmin.fleet.intake.ingest", "_upsert_gpus"),
    ("gpuadmin.fleet.history.record", "record_samples"),
    ("gpuadmin.fleet.history.record", "record_process_lives"),
    ("gpuadmin.fleet.history.record", "_known_lives"),
    ("gpuadmin.fleet.history.record", "_write_changed"),
    ("gpuadmin.fleet.history.record", "_record_points"),
    ("gpuadmin.fleet.findings.rules", "compute_findings"),
    ("gpuadmin.fleet.findings.sync", "sync_findings"),
    ("gpuadmin.fleet.history.record", "findings_facts"),
    ("gpuadmin.fleet.history.record", "update_idle_since"),
]


def time_stages(hosts: list[Any], round_number: int, count: int) -> None:
    """Wall ms per snapshot of each of ``STAGES`` over ``count`` snapshots, and the whole."""
    import importlib

    from gpuadmin.fleet.intake.ingest import receive_snapshot

    spent: dict[str, float] = {}
    spent_cpu: dict[str, float] = {}
    originals = []

    def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began, cpu_began = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - began
                spent_cpu[label] = spent_cpu.get(label, 0.0) + time.process_time() - cpu_began
        return wrapper

    for module_name, name in STAGES:
        module = importlib.import_module(module_name)
        originals.append((module, name, getattr(module, name)))
        setattr(module, name, timed(f"{module_name.rsplit('.', 1)[1]}.{name}", getattr(module, name)))
    messages = [host.message(round_number) for host in hosts[:count]]
    try:
        began, cpu_began = time.perf_counter(), time.process_time()
        for message in messages:
            receive_snapshot(message)
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
    print(f"stages of {len(messages)} snapshots, one process: {1000 * wall / len(messages):.1f} ms "
          f"per snapshot ({1000 * cpu / len(messages):.1f} ms CPU of this process)")
    # The wall time waits for PostgreSQL too; the CPU time is this process's own, which a busy
    # machine moves least.
    print(f"  {'step':36}{'wall ms':>9}{'CPU ms':>9}")
    for label, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        cpu_ms = 1000 * spent_cpu[label] / len(messages)
        print(f"  {label:36}{1000 * seconds / len(messages):9.2f}{cpu_ms:9.2f}")


def time_get(client: Any, label: str, path: str, repeats: int, headers: dict[str, str], *,
             expect: int = 200, before: Callable[[], object] = lambda: None) -> tuple[Timed, Any]:
    """Median and p95 of ``repeats`` requests (after warm-ups), each after ``before()`` (not timed)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    timings, cpu_times = [], []
    response = None
    for n in range(WARM_UP_REQUESTS + repeats):
        before()
        began, cpu_began = time.perf_counter(), time.process_time()
        response = client.get(path, **headers)
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
        if response.status_code != expect:
            raise RuntimeError(f"GET {path} ({label}) answered {response.status_code}, not {expect}")
        if n >= WARM_UP_REQUESTS:
            timings.append(elapsed)
            cpu_times.append(cpu)
    before()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path, **headers)
    return Timed(label, 1000 * statistics.median(timings), 1000 * percentile(timings, 0.95),
                 1000 * statistics.median(cpu_times), response.status_code, len(response.content),
                 len(queries)), response


def time_call(label: str, function: Callable[[], object], repeats: int) -> Timed:
    """Median and p95 of ``repeats`` calls of ``function`` (after warm-ups), with its queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    timings, cpu_times = [], []
    for n in range(WARM_UP_REQUESTS + repeats):
        began, cpu_began = time.perf_counter(), time.process_time()
        function()
        if n >= WARM_UP_REQUESTS:
            timings.append(time.perf_counter() - began)
            cpu_times.append(time.process_time() - cpu_began)
    with CaptureQueriesContext(connection) as queries:
        function()
    return Timed(label, 1000 * statistics.median(timings), 1000 * percentile(timings, 0.95),
                 1000 * statistics.median(cpu_times), 0, 0, len(queries))


def time_attention(repeats: int) -> list[Timed]:
    """The attention strip (the summary it rides with, and its lists) and the nav's count, uncached."""
    from django.utils import timezone

    from gpuadmin.web.attention import AttentionCount
    from gpuadmin.web.fleet_page import Attention, FleetSummary

    def strip() -> object:
        now = timezone.now()
        return Attention.of_fleet(FleetSummary.of_fleet(now), now)

    return [time_call("attention strip + totals", strip, repeats),
            time_call("nav count", lambda: AttentionCount.of_fleet(timezone.now()), repeats)]


def clone_hosts(count: int) -> None:
    """``count`` more hosts, copies of the ingested ones, summarised as ingest does (``--clone-hosts``)."""
    from itertools import cycle

    from django.db import transaction
    from django.db.models import Q
    from django.utils import timezone

    from gpuadmin.fleet.models import Finding, Gpu, Host, ProcessLife
    from gpuadmin.fleet.summary import refresh_host_summary

    began = time.perf_counter()
    templates = list(Host.objects.fleet().order_by("pk"))
    gpus = {t.pk: list(Gpu.objects.filter(host=t, present=True)) for t in templates}
    findings = {t.pk: list(Finding.objects.open().filter(host=t)) for t in templates}
    lives = {t.pk: list(ProcessLife.objects.filter(host=t, gone_at__isnull=True)
                        .filter(Q(last_gpu_memory_bytes__gt=0) | Q(was_orphaned=True))) for t in templates}
    now, day_ago = timezone.now(), timezone.now() - timedelta(days=1)
    for first in range(0, count, 500):
        with transaction.atomic():
            clones = []
            for n, template in zip(range(first, min(first + 500, count)), cycle(templates), strict=False):
                clone = Host(**{f.attname: getattr(template, f.attname) for f in Host._meta.concrete_fields
                                if not f.primary_key})
                clone.name, clone.public_key, clone.key_fingerprint = f"clone{n:05d}", "", ""
                clone.last_seen_at = day_ago if n % 50 == 0 else now
                clones.append((clone, template.pk))
            Host.objects.bulk_create([c for c, _ in clones])
            rows: dict[type, list[Any]] = {Gpu: [], Finding: [], ProcessLife: []}
            for clone, template_pk in clones:
                for model, originals in ((Gpu, gpus), (Finding, findings), (ProcessLife, lives)):
                    for original in originals[template_pk]:
                        copy = model(**{f.attname: getattr(original, f.attname)
                                        for f in model._meta.concrete_fields if not f.primary_key})
                        copy.host_id = clone.pk
                        if model is Gpu:
                            copy.uuid = f"{original.uuid}-{clone.pk}"
                        rows[model].append(copy)
            for model, copies in rows.items():
                model.objects.bulk_create(copies, batch_size=2000)
            for clone, _ in clones:
                refresh_host_summary(clone.pk, now=now)
    print(f"clones: {count} hosts copied and summarised in {time.perf_counter() - began:.0f} s", flush=True)


def forget_rendered_rows() -> None:
    """Empty the process's rendered rows (gpuadmin.web.fleet_page.row_html), if it keeps any."""
    from gpuadmin.web import fleet_page

    cached = getattr(fleet_page, "_cached_row_html", None)
    if cached is not None:
        cached.cache_clear()


def poll_path(page: str) -> str:
    import html

    match = POLLER.search(page)
    if not match:
        raise RuntimeError("the fleet page has no poller")
    return html.unescape(match.group(1))


def measure_pages(client: Any, hosts: list[Any], round_number: int, repeats: int) -> list[Timed]:
    from gpuadmin.fleet import synthetic

    htmx = {"HTTP_HX_REQUEST": "true"}
    rows = []
    full, response = time_get(client, "fleet page", "/", repeats, {})
    rows.append(full)
    page = response.content.decode()
    # Every row rendered again, as after a round in which every host of the page changed what it shows.
    rows.append(time_get(client, "fleet page, no row kept", "/", repeats, {}, before=forget_rendered_rows)[0])
    rows.append(time_get(client, "fleet page, kind=zombies", "/?kind=zombies", repeats, {})[0])
    rows.append(time_get(client, "fleet page 20", "/?page=20", repeats, {})[0])
    rows.append(time_get(client, "fleet page 2", "/?page=2", repeats, {})[0])
    rows.append(time_get(client, "fleet page, attention=1", "/?attention=1", repeats, {})[0])
    rows.append(time_get(client, "fleet page, sort=free", "/?sort=free", repeats, {})[0])
    rows.extend(time_attention(repeats))
    rows.append(time_get(client, "host page", f"/hosts/{hosts[0].name}/", repeats, {})[0])
    if not any(f'data-host="{h.name}"' in page for h in hosts):
        # Cloned hosts fill the first page (--clone-hosts): the polls watch a page of ingested hosts.
        response = client.get(f"/?name={hosts[0].name.rsplit('-', 1)[0]}-")
        page = response.content.decode()
    rows.append(time_get(client, "poll, nothing changed", poll_path(page), repeats, htmx, expect=204)[0])
    # One host's new snapshot: its row (and the summary) come back, nothing else. A poll answered
    # with changes is only once "changed": after it the client has the new version.
    first = next(h for h in hosts if f'data-host="{h.name}"' in page)
    synthetic.send(first, round_number)
    # The same poll (the same "seen") again and again: the same answer each time.
    timed, response = time_get(client, "poll, one host changed", poll_path(page), repeats, htmx)
    rows.append(timed)
    if response.content.decode().count("<tr id=") != 1:
        raise RuntimeError("one changed host did not come back as one row")
    for host in hosts:
        if f'data-host="{host.name}"' in page:
            synthetic.send(host, round_number + 1)
    rows.append(time_get(client, "poll, every row changed", poll_path(page), repeats, htmx)[0])
    return rows


def add_host_history(hosts: list[Any], minutes: int) -> None:
    """Each host's samples of the ``minutes`` before its enrolment, one per probe interval (10 s), each
    a copy of the sample its enrolment stored: the history a fleet that has run that long reads at
    each snapshot (the PID trend of a host with zombies spans the last hour)."""
    from copy import copy
    from datetime import timedelta

    from gpuadmin.fleet.models import HostSample

    samples = []
    for enrolled in HostSample.objects.filter(host__name__in=[h.name for h in hosts]):
        for n in range(1, 6 * minutes + 1):
            earlier = copy(enrolled)
            earlier.pk, earlier.taken_at = None, enrolled.taken_at - timedelta(seconds=10 * n)
            samples.append(earlier)
    HostSample.objects.bulk_create(samples, batch_size=5000)
    print(f"history: {len(samples)} host samples of the {minutes} minutes before enrolment", flush=True)


def enrol_in_the_past(hosts: list[Any], *, rounds_to_come: int) -> datetime:
    """Enrol every host (its first signed snapshot, key accepted), dated so that ``rounds_to_come``
    rounds after it (``round_taken_at``) end a minute ago: what depends on time (the lives'
    once-a-minute refresh) then comes as often as in a fleet. Returns when enrolment was taken."""
    from gpuadmin.fleet import synthetic

    enrolled_at = datetime.now(UTC) - timedelta(seconds=60 + ROUND_SECONDS * rounds_to_come)
    for host in hosts:
        synthetic.send(host, 0, taken_at=enrolled_at)
    return enrolled_at


def round_taken_at(enrolled_at: datetime, number: int) -> datetime:
    """When round ``number`` after an enrolment taken at ``enrolled_at`` is taken."""
    return enrolled_at + timedelta(seconds=ROUND_SECONDS * number)


def main_over_synthetic_hosts(argv: list[str] | None, description: str, prefix: str,
                              run: Callable[[int], int], *, default_hosts: int = 200) -> int:
    """The ``main`` of a benchmark of ``--hosts`` synthetic hosts on a throwaway PostgreSQL
    (``django_on_postgres``, ``prefix`` its data directory's): ``run(hosts)``'s exit status. No host
    goes offline meanwhile (a probe interval of an hour)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hosts", type=int, default=default_hosts)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    args = parser.parse_args(argv)
    processes.guard()
    os.environ["GPUADMIN_PROBE_INTERVAL"] = "3600"
    with django_on_postgres(prefix, wait=not args.no_wait):
        return run(args.hosts)


def enrolled_fleet(count: int, *, full_rounds: int) -> tuple[list[Any], datetime]:
    """``count`` synthetic hosts (``gpuadmin.fleet.synthetic``) enrolled through the real path, dated so
    that ``full_rounds`` rounds end a minute ago, the tables analyzed, then those rounds sent as full
    snapshots and received as central receives them; the hosts and when their last round was taken."""
    from django.conf import settings

    from gpuadmin.fleet import synthetic
    from gpuadmin.fleet.intake.ingest import receive_snapshot

    hosts = synthetic.demo_hosts(settings.DATA_DIR, count)
    enrolled_at = enrol_in_the_past(hosts, rounds_to_come=full_rounds + 1)
    analyze_after_setup()
    for number in range(1, full_rounds + 1):
        for host in hosts:
            receive_snapshot(host.message(number, taken_at=round_taken_at(enrolled_at, number)))
    return hosts, round_taken_at(enrolled_at, full_rounds)


def analyze_after_setup() -> None:
    """On PostgreSQL, the statistics of the tables enrolment and history have just filled, as
    autovacuum has them a minute later: without them the first rate measured the planner's guesses
    over near-empty tables, and autovacuum catching up meanwhile (146 against 215 snapshots/s)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def run_database(args: argparse.Namespace, vendor: str, database_url: str | None) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from gpuadmin.fleet import synthetic

    logging.disable(logging.WARNING)  # a thousand "host offered key" lines say nothing here
    hosts = synthetic.demo_hosts(settings.DATA_DIR, args.hosts, gpus=args.gpus, processes=args.processes)
    over = f" over {args.over}" if vendor == "postgresql" else ""
    print(f"\n== {vendor}{over}: {args.hosts} hosts x {args.gpus} GPUs, {args.processes} processes each, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start ==", flush=True)
    measured = [] if args.skip_ingest else hosts[: args.rate_hosts]
    rate_runs = sorted({1, args.workers}) if measured else []
    began = time.perf_counter()
    enrolled_at = enrol_in_the_past(hosts, rounds_to_come=len(rate_runs) * args.rounds)
    print(f"enrolment (offer, accept, store): {len(hosts) / (time.perf_counter() - began):.0f} hosts/s",
          flush=True)
    if args.history_minutes:
        add_host_history(hosts, args.history_minutes)
    analyze_after_setup()
    last_round = 0
    for workers in rate_runs:
        numbers = range(last_round + 1, last_round + args.rounds + 1)
        rounds = [(n, round_taken_at(enrolled_at, n)) for n in numbers]
        last_round = rounds[-1][0]
        rate, cpu_ms, server_cpu_ms = ingest_rounds(measured, rounds, workers)
        server = f", {server_cpu_ms:.1f} ms of PostgreSQL's" if vendor == "postgresql" else ""
        of_rounds = f" ({args.rounds} rounds of {len(measured)} hosts)" if args.rounds > 1 else ""
        print(f"ingest, {workers} process{'es' if workers > 1 else ''}, {len(measured) * args.rounds} "
              f"snapshots{of_rounds}: {rate:.0f} snapshots/s ({1000 * workers / rate:.1f} ms per snapshot "
              f"per process; CPU per snapshot: {cpu_ms:.1f} ms of the ingest process{server}), "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    # Later snapshots are dated now, after every round above.
    if args.stages and measured:
        time_stages(measured, last_round + 1, args.stages)
    if args.profile and measured:
        profile_ingest(measured, last_round + 2 + bool(args.stages), args.profile)
    if args.skip_pages:
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return
    admin = get_user_model().objects.create_superuser(f"bench-{uuid.uuid4().hex[:8]}",
                                                     password=uuid.uuid4().hex)
    client = Client()
    client.force_login(admin)
    print_pages(f"{len(hosts)} hosts", measure_pages(client, hosts, last_round + 4, args.repeats))
    if args.clone_hosts:
        # The same pages again at the larger size, in the same run: side by side.
        clone_hosts(args.clone_hosts)
        analyze_after_setup()
        print_pages(f"{len(hosts) + args.clone_hosts} hosts",
                    measure_pages(client, hosts, last_round + 6, args.repeats))


def print_pages(fleet: str, pages: list[Timed]) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} at the end of the pages, {fleet}")
    print(f"{'request, ' + fleet:32}{'median ms':>10}{'p95 ms':>9}{'CPU ms':>8}{'status':>8}{'bytes':>9}"
          f"{'queries':>9}")
    for r in pages:
        print(f"{r.label:32}{r.median_ms:10.1f}{r.p95_ms:9.1f}{r.cpu_median_ms:8.1f}{r.status:8}{r.bytes:9}"
              f"{r.queries:9}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="ingest processes at once (after one alone)")
    parser.add_argument("--rate-hosts", type=int, default=300,
                        help="hosts whose fresh snapshots the ingest rate is measured on (after all enrol)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="snapshots of every rate host per rate, each round dated 10 s after the last")
    parser.add_argument("--repeats", type=int, default=30, help="timed requests per page (after 2 warm-ups)")
    parser.add_argument("--skip-ingest", action="store_true",
                        help="measure no ingest rate (step 2): enrolment and the pages only")
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--over", choices=["tcp", "socket"], default="tcp",
                        help="PostgreSQL over TCP on 127.0.0.1 or over its Unix socket")
    parser.add_argument("--history-minutes", type=int, default=0, metavar="M",
                        help="give each host M minutes of host samples before the rates (60: an hour, "
                             "the PID trend's window)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for running pytest processes")
    parser.add_argument("--skip-pages", action="store_true", help="measure ingest only, not the pages")
    parser.add_argument("--clone-hosts", type=int, default=0, metavar="N",
                        help="N more hosts copied from the ingested ones and summarised, before the pages")
    parser.add_argument("--stages", type=int, default=0, metavar="N",
                        help="ms per snapshot of each step of ingest over N snapshots (one process)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="queries of one snapshot and a cProfile of N (one process) after the rates")
    args = parser.parse_args(argv)
    processes.guard()
    print("command: python benchmarks/fleet.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.database in ("sqlite", "both"):
        # Its own process: Django is set up once per process, on one database.
        code = _in_child(args, "sqlite")
        if code:
            return code
    if args.database in ("postgresql", "both"):
        return _in_child(args, "postgresql")
    return 0


def _in_child(args: argparse.Namespace, vendor: str) -> int:
    child = multiprocessing.get_context("fork").Process(target=_run_child, args=(args, vendor))
    child.start()
    child.join()
    return child.exitcode or 0


def _run_child(args: argparse.Namespace, vendor: str) -> None:
    # An unchanged fleet: no host turns offline while the pages are measured, minutes after its
    # snapshot (with the default 10 s interval, rows would change as hosts go offline one by one).
    os.environ["GPUADMIN_PROBE_INTERVAL"] = "3600"
    with throwaway_data_dir(f"gpuadmin-bench-fleet-{vendor}-", wait=not args.no_wait):
        if vendor == "sqlite":
            setup_django()
            run_database(args, vendor, None)
            return
        from tests import services

        with services.postgres_server() as server:
            url = server.socket_url if args.over == "socket" else server.url
            setup_django(url)
            run_database(args, vendor, url)


if __name__ == "__main__":
    sys.exit(main())
