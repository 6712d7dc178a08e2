"""`make run` for a bounded time under steady use: does it stay up, and does anything grow?

Starts `python -m gpuadmin.run` (what `make run` execs) on a throwaway data dir
with no REDIS_URL and no DATABASE_URL (the embedded broker and SQLite), a
simulated GPU and a short probe interval. While it runs:

- --browsers simulated browsers, each logged in with its own session, poll the
  fleet page, its htmx partial, the host page and the kill requests list over
  loopback every --poll-seconds;
- every --kill-every seconds a real dummy process is started on the simulated
  GPU; once a snapshot lists it, a requester files a kill request through the
  API and another admin approves it. Latency: the target's SIGINT handler
  time minus the request's `decided_at` (stamped in the approval's
  transaction, just before it commits); also shown minus the moment the
  approval was sent, which adds the HTTP request to it;
- every --sample-seconds: the RSS of every process of the run (supervisor,
  gunicorn master and workers, Celery's main process, pool and beat) and
  /healthz.

At the end it presses Ctrl+C and prints: duration, tasks the worker
processed, page requests and failures, restarts and crashes, RSS of each
process over time and the kill latency over time. Exit status 1 when anything
restarted or crashed, a page failed, a kill did not succeed, or the latency's
p95 reached 1 s.

    python benchmarks/soak.py [--minutes 30] [--probe-interval 2] [--browsers 3]
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import kill_latency, processes  # noqa: E402
from benchmarks.kill_latency import GPU_UUID, REQUIRED_P95_SECONDS, TARGET, percentile  # noqa: E402
from gpuadmin.data_dir import prepare_data_dir  # noqa: E402
from tests.services import free_port  # noqa: E402

GiB = 2**30
HOST = "soak-host"
ADMIN, REQUESTER, APPROVER = "soak-admin", "soak-requester", "soak-approver"
PASSWORD = "soak password 123"
PLAN = [{"signal": "SIGINT", "grace_seconds": 10}, {"signal": "SIGKILL", "grace_seconds": 10}]
FINAL_STATES = {"succeeded", "failed", "refused", "unkillable", "expired", "rejected", "cancelled"}
STEP_TIMEOUT_SECONDS = 60.0
PAGE_TIMEOUT_SECONDS = 30.0
# A browser asked to stop finishes the request it is in, or its login (two requests): waited for this long.
BROWSER_JOIN_SECONDS = 2 * PAGE_TIMEOUT_SECONDS + 10.0
MAX_RSS_COLUMNS = 8
STARTED_LINE = re.compile(r"^gpuadmin: started (?P<name>.+) \(pid (?P<pid>\d+)\)$")


# --- the run ------------------------------------------------------------------
@dataclass
class Run:
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    def follow(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in list(self.lines)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.2)

    def children(self) -> dict[str, int]:
        """Child name -> its current pid (the newest 'started' line wins)."""
        return {m["name"]: int(m["pid"]) for m in map(STARTED_LINE.match, list(self.lines)) if m}


def write_gpus(path: Path, holder_pids: list[int]) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps({
        "gpus": [{"uuid": GPU_UUID, "name": "Simulated soak", "memory_total_bytes": 80 * GiB,
                  "extra_used_bytes": 0, "utilization_percent": 30}],
        "processes": [{"pid": pid, "gpu_uuid": GPU_UUID, "used_memory_bytes": 2 * GiB}
                      for pid in holder_pids],
    }))
    os.replace(staging, path)  # the probe never reads half a file


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, check=False,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args[:1])} exited with status {done.returncode}:\n"
                           f"{done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


# --- processes and memory -------------------------------------------------------
def rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return 0  # a zombie has no VmRSS line


def run_processes(run: Run) -> dict[str, int]:
    """A label for each process of the run -> its pid."""
    found = {"supervisor": run.process.pid}
    for name, leader in run.children().items():
        short = "gunicorn" if "gunicorn" in name else "celery"
        for pid in processes.session_members(leader):
            role = ("master" if short == "gunicorn" else "main") if pid == leader else f"child {pid}"
            found[f"{short} {role}"] = pid
    return found


# --- browsers -------------------------------------------------------------------
@dataclass
class PageStats:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    # Failed once the panel was being stopped (a browser still polling then): expected, not counted.
    cut_short: list[str] = field(default_factory=list)
    # Set just before the panel is stopped, after the browsers were asked to stop and waited for.
    panel_stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, what: str) -> None:
        with self.lock:
            (self.cut_short if self.panel_stopping.is_set() else self.failures).append(what)


def logged_in_opener(base: str, username: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/login/", timeout=PAGE_TIMEOUT_SECONDS).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "no CSRF token on the login page"
    form = urllib.parse.urlencode({"username": username, "password": PASSWORD,
                                   "csrfmiddlewaretoken": token.group(1)}).encode()
    request = urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"})
    opener.open(request, timeout=PAGE_TIMEOUT_SECONDS).read()
    return opener


def browse(base: str, poll_seconds: float, stop: threading.Event, stats: PageStats) -> None:
    try:
        opener = logged_in_opener(base, ADMIN)
    except Exception as exc:  # reported, not raised: the soak goes on
        stats.failed(f"login: {exc}")
        return
    pages = [("/", {}), ("/", {"HX-Request": "true"}), (f"/hosts/{HOST}/", {}),
             (f"/hosts/{HOST}/", {"HX-Request": "true"}), ("/kills/", {})]
    while not stop.is_set():
        for path, headers in pages:
            if stop.is_set():  # the end of the soak waits for this browser: at most one request more
                return
            try:
                request = urllib.request.Request(f"{base}{path}", headers=headers)
                with opener.open(request, timeout=PAGE_TIMEOUT_SECONDS) as answer:
                    answer.read()
                    ok = answer.status == 200 and "/login/" not in answer.url
            except (urllib.error.URLError, OSError) as exc:
                ok, answer = False, exc
            with stats.lock:
                stats.requests += 1
            if not ok:
                stats.failed(f"{time.strftime('%H:%M:%S')} {path}: {answer}")
        stop.wait(poll_seconds)


# --- kills through the API ------------------------------------------------------
def api(base: str, token: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{base}/api/v1/{path}", data=data, headers={
        "Authorization": f"Token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def wait_for(what: str, check, timeout: float = STEP_TIMEOUT_SECONDS):
    # The panel answers in its own time: a slower poll than the latency benchmark's keeps the load honest.
    return kill_latency.wait_for(what, check, timeout, poll_seconds=0.2)


@dataclass(frozen=True)
class Panel:
    """The running panel as the kill loop uses it."""

    base: str
    tokens: dict[str, str]
    gpus_file: Path
    holders: list[int]
    work: Path


@dataclass(frozen=True)
class Kill:
    minute: float  # since the soak began
    from_decision_seconds: float  # decided_at → the target's SIGINT handler
    from_sending_seconds: float  # approval request sent → the target's SIGINT handler
    status: str


def one_kill(panel: Panel, number: int, minute: float) -> Kill:
    """File and approve a kill of a fresh dummy process, wait until it is final."""
    base, tokens, gpus_file, holders = panel.base, panel.tokens, panel.gpus_file, panel.holders
    work = panel.work
    stamp = work / f"sigint-{number}.txt"
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(stamp)], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        write_gpus(gpus_file, [*holders, target.pid])

        def listed() -> dict | None:
            host = api(base, tokens[REQUESTER], f"hosts/{HOST}/")
            return next((p for p in host["processes"] if p["pid"] == target.pid), None)

        record = wait_for("the target in a snapshot", listed)
        filed = api(base, tokens[REQUESTER], "kill-requests/", {
            "host": HOST, "pid": target.pid, "start_time_ticks": record["start_time_ticks"],
            "plan": PLAN, "reason": f"soak request {number}"})
        sent_at = time.time()
        approved = api(base, tokens[APPROVER], f"kill-requests/{filed['id']}/approve", {})
        decided_at = datetime.fromisoformat(approved["decided_at"]).timestamp()
        signalled_at = float(wait_for("the target's SIGINT handler",
                                      lambda: stamp.exists() and stamp.read_text()))
        target.wait(timeout=STEP_TIMEOUT_SECONDS)

        def final() -> str | None:
            status = api(base, tokens[REQUESTER], f"kill-requests/{filed['id']}/")["status"]
            return status if status in FINAL_STATES else None

        status = wait_for("the request to be final", final)
        return Kill(minute, signalled_at - decided_at, signalled_at - sent_at, status)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
        write_gpus(gpus_file, holders)


# --- the soak -------------------------------------------------------------------
def soak(args: argparse.Namespace, work: Path) -> int:
    port = args.port or free_port()
    # `make run`'s data dir step, done here since the migration below runs before gpuadmin.run would.
    prepare_data_dir(work / "data")
    holder = processes.spawn([sys.executable, "-c", "import time; time.sleep(10**6)"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        return _soak(args, work, port, holder)
    finally:
        processes.stop(holder)


def _soak(args: argparse.Namespace, work: Path, port: int, holder: subprocess.Popen) -> int:
    base = f"http://127.0.0.1:{port}"
    gpus_file = work / "gpus.json"
    holders = [holder.pid]
    write_gpus(gpus_file, holders)
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({
        "GPUADMIN_DATA_DIR": str(work / "data"), "PORT": str(port), "GPUADMIN_HOST_NAME": HOST,
        "GPUADMIN_GPU_BACKEND": "simulated", "GPUADMIN_SIMULATED_GPUS": str(gpus_file),
        "GPUADMIN_PROBE_INTERVAL": str(args.probe_interval), "GPUADMIN_ADMIN_USER": ADMIN,
        "GPUADMIN_ADMIN_PASSWORD": PASSWORD, "SOAK_PASSWORD": PASSWORD, "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
        # A line per task that succeeded, which the report counts (quiet by default: settings.LOGGING).
        "GPUADMIN_TASK_LOG_LEVEL": "INFO",
    })
    manage(env, "migrate", "--no-input", "-v", "0")
    manage(env, "createuser", REQUESTER, "--role", "requester", "--role", "viewer", "--password-env",
           "SOAK_PASSWORD")
    manage(env, "createuser", APPROVER, "--role", "approver", "--role", "viewer", "--password-env",
           "SOAK_PASSWORD")
    tokens = {name: manage(env, "api_token", name) for name in (REQUESTER, APPROVER)}

    process = processes.spawn([sys.executable, "-m", "gpuadmin.run"], cwd=REPO, env=env, text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run = Run(process)
    threading.Thread(target=run.follow, daemon=True).start()
    stop = threading.Event()
    stats = PageStats()
    samples: list[tuple[float, dict[str, int | None], dict]] = []
    kills: list[Kill] = []
    kill_errors: list[str] = []
    exit_status: int | None = None
    browsers: list[threading.Thread] = []
    try:
        run.wait_for(r"^gpuadmin is running at ", 120)
        started = time.monotonic()
        wait_for("the first snapshot", lambda: api(base, tokens[REQUESTER], "hosts/"), timeout=60)
        browsers = [threading.Thread(target=browse, args=(base, args.poll_seconds, stop, stats), daemon=True)
                    for _ in range(args.browsers)]
        for browser in browsers:
            browser.start()
        end = started + args.minutes * 60
        next_sample = next_kill = time.monotonic()
        number = 0
        while time.monotonic() < end and process.poll() is None:
            now = time.monotonic()
            if now >= next_sample:
                next_sample += args.sample_seconds
                with urllib.request.urlopen(f"{base}/healthz", timeout=30) as answer:
                    health = json.loads(answer.read())
                samples.append(((now - started) / 60, {label: rss_kib(pid) for label, pid
                                                       in run_processes(run).items()}, health))
            if now >= next_kill:
                next_kill += args.kill_every
                number += 1
                try:
                    panel = Panel(base, tokens, gpus_file, holders, work)
                    kills.append(one_kill(panel, number, (now - started) / 60))
                except Exception as exc:  # counted and reported
                    kill_errors.append(f"kill {number}: {type(exc).__name__}: {exc}")
            time.sleep(max(0.0, min(next_sample, next_kill, end) - time.monotonic()))
        duration_minutes = (time.monotonic() - started) / 60
        with urllib.request.urlopen(f"{base}/healthz", timeout=30) as answer:
            last_health = json.loads(answer.read())
        samples.append((duration_minutes, {label: rss_kib(pid) for label, pid in run_processes(run).items()},
                        last_health))
    finally:
        # The browsers first, while the panel still answers them: a request of theirs that the stop cut
        # would read as the panel failing. One still in a request after BROWSER_JOIN_SECONDS is hanging.
        stop.set()
        for browser in browsers:
            browser.join(timeout=BROWSER_JOIN_SECONDS)
            if browser.is_alive():
                stats.failed(f"a browser still in a request {BROWSER_JOIN_SECONDS:.0f} s after the stop")
        stats.panel_stopping.set()
        # Ctrl+C, as a terminal would give it to `make run`: its supervisor stops its children.
        exit_status = processes.stop(process, first_signal=signal.SIGINT, grace_seconds=60)
    return report(args, Results(run, exit_status, duration_minutes, stats, samples, kills, kill_errors))


@dataclass
class Results:
    run: Run
    exit_status: int | None
    duration_minutes: float
    stats: PageStats
    samples: list[tuple[float, dict[str, int | None], dict]]
    kills: list[Kill]
    kill_errors: list[str]


def report(args: argparse.Namespace, results: Results) -> int:
    run, exit_status, duration_minutes = results.run, results.exit_status, results.duration_minutes
    stats, samples, kills, kill_errors = results.stats, results.samples, results.kills, results.kill_errors
    output = "\n".join(run.lines)
    tasks = len(re.findall(r"Task \S+ succeeded in", output))
    task_failures = len(re.findall(r"Task \S+ raised unexpected", output))
    crashes = [line for line in run.lines if "unexpectedly" in line or "Unrecoverable error" in line]
    restarts = samples[-1][2]["supervisor_restarts"] if samples else None
    print(f"soak of `python -m gpuadmin.run`: {duration_minutes:.1f} min, "
          f"probe interval {args.probe_interval} s, "
          f"{args.browsers} browsers every {args.poll_seconds} s, a kill every {args.kill_every} s "
          f"[{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs]")
    print(f"tasks processed by the worker: {tasks} ({task_failures} raised)")
    print(f"page requests: {stats.requests}, failed: {len(stats.failures)}, "
          f"cut short by the panel's stop (not counted): {len(stats.cut_short)}")
    for failure in stats.failures[:5]:
        print(f"  {failure}")
    print(f"supervisor restarts: {restarts}; crash lines: {len(crashes)}; "
          f"exit status on Ctrl+C: {exit_status}")
    for line in crashes[:5]:
        print(f"  {line}")
    last_health = samples[-1][2] if samples else {}
    print(f"last /healthz: {json.dumps(last_health)}")

    # RSS of each process: the samples, thinned to at most MAX_RSS_COLUMNS columns.
    step = max(1, -(-len(samples) // MAX_RSS_COLUMNS))
    shown = samples[::step] if samples[::step][-1] is samples[-1] else [*samples[::step], samples[-1]]
    labels = sorted({label for _, rss, _ in samples for label in rss})
    print("\nRSS (MiB) by minute")
    print(f"{'process':<22}" + "".join(f"{minute:>8.1f}" for minute, _, _ in shown) + f"{'change':>9}")
    for label in labels:
        values = [rss.get(label) for _, rss, _ in shown]
        cells = "".join(f"{v / 1024:>8.1f}" if v is not None else f"{'-':>8}" for v in values)
        present = [v for v in values if v is not None]
        change = f"{(present[-1] - present[0]) / 1024:>+9.1f}" if len(present) > 1 else f"{'':>9}"
        print(f"{label:<22}{cells}{change}")

    print("\nkill → target's SIGINT handler (ms), by 5-minute span: from the approval's decided_at "
          "| from sending the approval request")
    for start in range(0, int(duration_minutes) + 1, 5):
        span = [k for k in kills if start <= k.minute < start + 5]
        if span:
            decided = [k.from_decision_seconds * 1000 for k in span]
            sent = [k.from_sending_seconds * 1000 for k in span]
            print(f"  min {start:>3}-{start + 5:<3} n={len(span):<3} "
                  f"p50 {statistics.median(decided):7.1f}  max {max(decided):7.1f} | "
                  f"p50 {statistics.median(sent):7.1f}  max {max(sent):7.1f}")
    succeeded = sum(1 for k in kills if k.status == "succeeded")
    latencies = [k.from_decision_seconds for k in kills]
    p95 = percentile(latencies, 0.95) if latencies else float("inf")
    sent_p95 = percentile([k.from_sending_seconds for k in kills], 0.95) if kills else float("inf")
    print(f"  all: {len(kills)} kills, {succeeded} succeeded, p95 {p95 * 1000:.1f} ms from decided_at "
          f"(required < {REQUIRED_P95_SECONDS * 1000:.0f} ms), {sent_p95 * 1000:.1f} ms from sending")
    for error in kill_errors[:5]:
        print(f"  {error}")

    healthy = (restarts == 0 and not crashes and exit_status == 0 and not stats.failures and not kill_errors
               and succeeded == len(kills) and p95 < REQUIRED_P95_SECONDS)
    print("\nverdict: " + ("stayed up, nothing restarted" if healthy else "FAILED (see above)"))
    return 0 if healthy else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--probe-interval", type=int, default=2, help="GPUADMIN_PROBE_INTERVAL, seconds")
    parser.add_argument("--browsers", type=int, default=3)
    parser.add_argument("--poll-seconds", type=float, default=2.0, help="each browser's pause between rounds")
    parser.add_argument("--kill-every", type=float, default=60.0, help="seconds between kill requests")
    parser.add_argument("--sample-seconds", type=float, default=60.0, help="seconds between RSS samples")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (data dir, logs)")
    args = parser.parse_args()
    processes.guard()
    work = Path(tempfile.mkdtemp(prefix="gpuadmin-soak-"))
    try:
        return soak(args, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
