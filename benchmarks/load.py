"""Load: simulated admins polling the fleet and host pages while snapshots pour in, on PostgreSQL.

Starts a throwaway PostgreSQL and redis-server (tests/services.py) and
`python -m gpuadmin.run` on them (gunicorn, and one Celery worker with the
scheduler: GPUADMIN_WORKER_CONCURRENCY=--concurrency pool processes), all on
loopback. Then, for --seconds:

- --hosts synthetic hosts, each enrolled with its own key, send signed
  snapshots (8 GPUs, ~25 processes: benchmarks/pages.py's typical host) at
  --rate snapshots per second in all, published to central's queue exactly as
  agents publish them, so they go through the real ingest path;
- --admins simulated admins, each logged in with its own session, poll what
  their browsers poll through htmx (HX-Request): the fleet page and a host
  page, every --poll-seconds (the pages' own refresh interval by default),
  after one full load of each. The fleet poll asks what the page's poller
  asks (``seen=``: the version the page shows), so it is answered 204 or
  with the changed rows only, as in a browser.

At the end it prints: requests and errors, p50/p95/p99 per page, snapshots
sent and ingested per second and the backlog left, the CPU seconds of each
part (web, worker, PostgreSQL, Redis, this load generator) and of the whole
machine, and the database's size before and after. Exit status 1 on any error.

    python benchmarks/load.py [--seconds 300] [--admins 50] [--rate 100] [--hosts 100]
"""

from __future__ import annotations

import argparse
import contextlib
import html
import http.cookiejar
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import processes  # noqa: E402
from benchmarks.kill_latency import percentile  # noqa: E402
from benchmarks.soak import Run  # noqa: E402
from tests.services import free_port, postgres_server, redis_server  # noqa: E402

ADMIN = "load-admin"
PASSWORD = "load password 123"
CENTRAL_HOST = "load-central"
READY_TIMEOUT_SECONDS = 180
SNAPSHOT_EXPIRES_SECONDS = 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOADED_LINE = "load: running:"
INTERRUPTED_LINE = "load: interrupted; reporting what was measured so far"
FLEET_POLLER = re.compile(r'<div id="fleet-poll" hidden hx-get="([^"]+)"')


# --- CPU ------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, and the same for waited-for children (fields 14-17 of stat)
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as stat:
                if int(stat.read().rsplit(b")", 1)[1].split()[1]) == parent:
                    found.append(int(entry))
    return found


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


@dataclass
class CpuParts:
    """Which processes make up each part; sampled at the start and the end."""

    parts: dict[str, list[int]] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for label, pids in self.parts.items():
            totals[label] = sum(cpu_seconds(pid) for pid in pids)
        return totals


# --- admins ---------------------------------------------------------------------
@dataclass
class PageTimes:
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def logged_in(base: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = opener.open(f"{base}/login/", timeout=60).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "no CSRF token on the login page"
    form = urllib.parse.urlencode({"username": ADMIN, "password": PASSWORD,
                                   "csrfmiddlewaretoken": token.group(1)}).encode()
    opener.open(urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"}),
                timeout=60).read()
    return opener


def get(opener: urllib.request.OpenerDirector, base: str, label: str, path: str, *, htmx: bool,
        times: PageTimes) -> str:
    """One request, timed; its body ("" for a 204 or an error, which is recorded)."""
    headers = {"HX-Request": "true"} if htmx else {}
    began = time.perf_counter()
    body = ""
    try:
        with opener.open(urllib.request.Request(f"{base}{path}", headers=headers), timeout=60) as answer:
            body = answer.read().decode()
            # 204: a fleet poll with nothing changed (htmx swaps nothing).
            ok = answer.status in (200, 204) and "/login/" not in answer.url
            problem = f"status {answer.status} at {answer.url}"
    except (urllib.error.URLError, OSError) as error:
        ok, problem = False, str(error)
    elapsed = time.perf_counter() - began
    with times.lock:
        if ok:
            times.seconds[label].append(elapsed)
        else:
            times.errors.append(f"{time.strftime('%H:%M:%S')} {label} {path}: {problem}")
    return body


def fleet_poll_path(body: str, current: str) -> str:
    """What the fleet page's poller asks next: it says what the page shows (``seen=``), so an
    unchanged fleet answers 204 and a changed one only its changed rows, as in a browser."""
    match = FLEET_POLLER.search(body)
    return html.unescape(match.group(1)) if match else current


def admin(base: str, hosts: list[str], poll_seconds: float, stop: threading.Event, times: PageTimes) -> None:
    try:
        opener = logged_in(base)
    except Exception as error:  # counted, not raised: the others go on
        with times.lock:
            times.errors.append(f"login: {type(error).__name__}: {error}")
        return
    host = random.choice(hosts)
    fleet_poll = fleet_poll_path(get(opener, base, "fleet page (full)", "/", htmx=False, times=times), "/")
    get(opener, base, "host page (full)", f"/hosts/{host}/", htmx=False, times=times)
    stop.wait(random.uniform(0, poll_seconds))  # browsers do not poll in step
    while not stop.is_set():
        answer = get(opener, base, "fleet poll (htmx)", fleet_poll, htmx=True, times=times)
        fleet_poll = fleet_poll_path(answer, fleet_poll)
        get(opener, base, "host poll (htmx)", f"/hosts/{host}/", htmx=True, times=times)
        stop.wait(poll_seconds)


# --- synthetic hosts -------------------------------------------------------------
@dataclass
class Sender:
    sent: int = 0
    errors: list[str] = field(default_factory=list)


def enrol_hosts(count: int) -> list[tuple[str, Any, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Hosts with their keys, accepted as an approver would; (name, key, processes, gpus) each."""
    from benchmarks.pages import typical_host
    from gpuadmin.fleet.intake import trust
    from gpuadmin.wire.signing import generate_private_key, public_key_text

    hosts = []
    for index in range(count):
        name = f"load{index:04d}"
        key = generate_private_key()
        trust.accept_host(name, actor_name="load benchmark", public_key=public_key_text(key))
        processes, gpus = typical_host(index)
        hosts.append((name, key, processes, gpus))
    return hosts


def send_snapshots(hosts: list[tuple[str, Any, list[dict[str, Any]], list[dict[str, Any]]]], rate: float,
                   stop: threading.Event, sender: Sender) -> None:
    from gpuadmin.celery import CENTRAL_QUEUE, app
    from gpuadmin.wire.signing import MessageKind, compress_envelope, seal
    from gpuadmin.wire.task_names import INGEST_SNAPSHOT
    from tests.factories import snapshot

    began = time.monotonic()
    while not stop.is_set():
        name, key, processes, gpus = hosts[sender.sent % len(hosts)]
        # Compressed as gpuadmin.sending sends an agent's (this script's expiry is its own).
        sealed = seal(snapshot(name, processes=processes, gpus=gpus), MessageKind.SNAPSHOT, key)
        message = compress_envelope(sealed)
        try:
            app.send_task(INGEST_SNAPSHOT, args=[message], queue=CENTRAL_QUEUE,
                          expires=SNAPSHOT_EXPIRES_SECONDS)
        except Exception as error:  # counted, not raised
            sender.errors.append(f"publish: {type(error).__name__}: {error}")
        sender.sent += 1
        delay = began + sender.sent / rate - time.monotonic()
        if delay > 0:
            stop.wait(delay)


# --- the run ---------------------------------------------------------------------
def database_size_bytes() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        return int(cursor.fetchone()[0])


# Snapshots stored, counted exactly and at once (the worker says nothing per task): a sequence that
# a trigger draws from for each row an accepted snapshot writes to its host's latest-snapshot row, the
# one row every snapshot, full or update, inserts or rewrites. Not raw samples: those are written only
# when a figure moves or a minute passed (gpuadmin/fleet/history/record.py). A sequence takes no row
# lock, so the worker's processes do not queue on the count.
_COUNT_INGESTED = """
CREATE SEQUENCE bench_ingested;
CREATE FUNCTION bench_count_ingested() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN PERFORM nextval('bench_ingested'); RETURN NULL; END $$;
CREATE TRIGGER bench_count_ingested AFTER INSERT OR UPDATE ON {table}
    FOR EACH ROW EXECUTE FUNCTION bench_count_ingested();
"""


def count_ingested() -> None:
    from django.db import connection

    from gpuadmin.fleet.models import LatestSnapshot

    with connection.cursor() as cursor:
        cursor.execute(_COUNT_INGESTED.format(table=connection.ops.quote_name(LatestSnapshot._meta.db_table)))


def ingested() -> int:
    """Snapshots stored so far (``count_ingested``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM bench_ingested")
        return int(cursor.fetchone()[0])


def load(args: argparse.Namespace, work: Path) -> int:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with postgres_server() as database, redis_server() as broker:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUADMIN_", "COVERAGE_"))}
        env.update({
            "DATABASE_URL": database.url, "REDIS_URL": broker.url, "GPUADMIN_DATA_DIR": str(work / "data"),
            "PORT": str(port), "GPUADMIN_HOST_NAME": CENTRAL_HOST, "GPUADMIN_GPU_BACKEND": "none",
            "GPUADMIN_ADMIN_USER": ADMIN, "GPUADMIN_ADMIN_PASSWORD": PASSWORD,
            "GPUADMIN_WORKER_CONCURRENCY": str(args.concurrency), "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        })
        process = processes.spawn([sys.executable, "-m", "gpuadmin.run"], cwd=REPO, env=env, text=True,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        run = Run(process)
        threading.Thread(target=run.follow, daemon=True).start()
        try:
            run.wait_for(r"^gpuadmin is running at ", READY_TIMEOUT_SECONDS)
            # This process enrols the hosts and publishes like their agents: the same database and broker.
            os.environ.update({key: env[key] for key in ("DATABASE_URL", "REDIS_URL", "GPUADMIN_DATA_DIR",
                                                         "DJANGO_SETTINGS_MODULE")})
            import django

            django.setup()
            count_ingested()
            hosts = enrol_hosts(args.hosts)
            return measure(args, base, run, database=database, broker=broker, hosts=hosts)
        finally:
            processes.stop(process, first_signal=signal.SIGINT, grace_seconds=60)


def measure(args: argparse.Namespace, base: str, run: Run, *, database: Any, broker: Any,
            hosts: list[tuple[str, Any, list[dict[str, Any]], list[dict[str, Any]]]]) -> int:
    import redis

    from gpuadmin.celery import CENTRAL_QUEUE

    stop = threading.Event()
    sender = Sender()
    # One snapshot of every host first, so that every host page has something to show.
    send_snapshots(hosts, rate=args.rate, stop=_after(len(hosts), sender), sender=sender)
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while ingested() < len(hosts) and time.monotonic() < deadline:
        time.sleep(0.5)
    size_before = database_size_bytes()
    times = PageTimes()
    names = [host[0] for host in hosts]
    admins = [threading.Thread(target=admin, args=(base, names, args.poll_seconds, stop, times), daemon=True)
              for _ in range(args.admins)]
    for thread in admins:
        thread.start()
    postmaster = int((database.socket_dir.parent / "data" / "postmaster.pid").read_text().split()[0])
    children = dict(_run_children(run))
    cpu = CpuParts({
        "web (gunicorn)": processes.session_members(children["web"]),
        "worker (celery + beat)": processes.session_members(children["worker"]),
        "PostgreSQL": [postmaster, *children_of(postmaster)],
        "Redis": [broker.process.pid],
        "load generator (this process)": [os.getpid()],
    })
    sent_before, ingested_before = sender.sent, ingested()
    cpu_before, machine_before = cpu.sample(), machine_busy_seconds()
    began = time.monotonic()
    sending = threading.Thread(target=send_snapshots, args=(hosts, args.rate, stop, sender), daemon=True)
    sending.start()
    # What benchmarks/kill_latency.py --under-load waits for before it measures.
    print(f"{LOADED_LINE} {args.admins} admins, {args.rate:g} snapshots/s offered", flush=True)
    try:
        stop.wait(args.seconds)
    except KeyboardInterrupt:  # Ctrl+C (or kill_latency.py --under-load) ends the load early, reported
        print(INTERRUPTED_LINE, flush=True)
    # PostgreSQL's backends come and go: count those alive at the end too.
    cpu.parts["PostgreSQL"] = sorted({*cpu.parts["PostgreSQL"], *children_of(postmaster)})
    cpu_after, machine_after = cpu.sample(), machine_busy_seconds()
    elapsed = time.monotonic() - began
    stop.set()
    sending.join(timeout=30)
    for thread in admins:
        thread.join(timeout=60)
    backlog = redis.Redis.from_url(broker.url).llen(CENTRAL_QUEUE)
    sent, done = sender.sent - sent_before, ingested() - ingested_before
    size_after = database_size_bytes()

    print(f"load: {elapsed:.0f} s on PostgreSQL + Redis, {args.admins} admins polling every "
          f"{args.poll_seconds:g} s, {args.hosts} hosts, target {args.rate:g} snapshots/s, "
          f"worker concurrency {args.concurrency}, {os.cpu_count()} CPUs")
    print(f"snapshots: sent {sent} ({sent / elapsed:.1f}/s), ingested {done} ({done / elapsed:.1f}/s), "
          f"backlog at the end {backlog}")
    requests = sum(len(v) for v in times.seconds.values())
    print(f"page requests: {requests} ok, {len(times.errors)} errors; publish errors: {len(sender.errors)}")
    print(f"{'page':<22}{'n':>7}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for label in sorted(times.seconds):
        values = times.seconds[label]
        print(f"{label:<22}{len(values):>7}{percentile(values, 0.5) * 1000:>9.0f}"
              f"{percentile(values, 0.95) * 1000:>9.0f}{percentile(values, 0.99) * 1000:>9.0f}"
              f"{max(values) * 1000:>9.0f}")
    print("CPU (seconds of CPU time; % of one core over the run):")
    for label in cpu.parts:
        used = cpu_after[label] - cpu_before[label]
        print(f"  {label:<32}{used:>8.1f} s {100 * used / elapsed:>6.0f} %")
    busy = machine_after[0] - machine_before[0]
    total = machine_after[1] - machine_before[1]
    print(f"  {'whole machine (all processes)':<32}{busy:>8.1f} s {100 * busy / total:>6.0f} % of all cores")
    growth = size_after - size_before
    print(f"database: {size_before / 2**20:.1f} MiB -> {size_after / 2**20:.1f} MiB "
          f"(+{growth / 2**20:.1f} MiB, {growth / max(done, 1) / 1024:.1f} KiB per ingested snapshot)")
    for error in (times.errors + sender.errors)[:20]:
        print(f"  error: {error}")
    return 1 if times.errors or sender.errors else 0


def _after(count: int, sender: Sender) -> threading.Event:
    """An event that is set once ``count`` more snapshots were sent (the first round)."""
    target = sender.sent + count

    class Counted(threading.Event):
        def is_set(self) -> bool:
            return sender.sent >= target

    return Counted()


def _run_children(run: Run) -> list[tuple[str, int]]:
    found = []
    for name, pid in run.children().items():
        found.append(("web" if "gunicorn" in name else "worker", pid))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300, help="how long to load it (default 300)")
    parser.add_argument("--admins", type=int, default=50)
    parser.add_argument("--rate", type=float, default=100, help="snapshots per second, all hosts together")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--poll-seconds", type=float, default=10,
                        help="each admin's poll interval (the pages refresh every probe interval, 10 s)")
    parser.add_argument("--concurrency", type=int, default=2, help="central worker pool processes")
    args = parser.parse_args()
    processes.guard()
    with tempfile.TemporaryDirectory(prefix="gpuadmin-load-") as work:
        return load(args, Path(work))


if __name__ == "__main__":
    sys.exit(main())
