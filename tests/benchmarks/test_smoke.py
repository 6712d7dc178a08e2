"""The smoke tier of benchmarks/: every script runs with its smallest arguments, exits 0, leaves nothing.

Each script runs as a README reader would start it (`python benchmarks/<script> ...`) under
tests/run/programs/harness.py, a child subreaper: whatever the script orphaned on its way out
is re-parented to the harness, which reports and kills it. The long-running ones are also
interrupted (SIGINT, as Ctrl+C gives it; SIGTERM, as `kill` and systemd give it) as soon as they
are known to be where a reader would stop them (INTERRUPTIONS), and must still leave nothing behind.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.kill_latency import TARGET
from benchmarks.processes import children_of
from tests import services
from tests.run.helpers import REPO, SupervisedRun

pytestmark = pytest.mark.services

BENCHMARKS = REPO / "benchmarks"
NOT_SCRIPTS = {"__init__.py", "django_bench.py", "processes.py"}  # modules the scripts share
RUN_TIMEOUT_SECONDS = 300
START_TIMEOUT_SECONDS = 180
# A kill target lives a fraction of a second in kill_latency.py: looked for this often.
PHASE_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Smoke:
    args: str  # split on spaces; {tmp} is the test's own temporary folder
    needs: tuple[str, ...] = ()  # "postgres", "redis", "valgrind"


SMOKE: dict[str, Smoke] = {
    "audit_verify.py": Smoke("--events 64 --batch 16 --repeats 1 --no-wait"),
    "broker_race.py": Smoke("--messages 20"),
    # Every scenario for real (processes, probe, executor) on the simulated GPU; the default (nvml)
    # backend's "no GPU here" is tests/benchmarks/test_gpu_check.py's.
    "gpu_check.py": Smoke("--backend simulated --holders-mib 64 --grace-seconds 1"),
    "fairuse_evaluate.py": Smoke("--hosts 2 --no-wait", ("postgres",)),
    "fleet.py": Smoke("--hosts 3 --gpus 1 --processes 5 --workers 1 --rate-hosts 3 --repeats 1 "
                      "--clone-hosts 4 --database sqlite --no-wait"),
    # Two 3-second rounds of 10 hosts through redis-server, the worker and beat, on PostgreSQL.
    "fleet_soak.py": Smoke("--hosts 10 --minutes 0.1 --interval-seconds 3 --gpus 2 --processes 30 "
                           "--sample-seconds 3 --senders 1 --repeats 1 --no-wait", ("postgres", "redis")),
    "history.py": Smoke("--days 1 --gpus 1 --growth 1 --repeats 1 --no-wait", ("postgres",)),
    "history_fleet.py": Smoke("--hosts 3 --gpus 1 --minutes 30 --repeats 1 --no-wait", ("postgres",)),
    # The other version is this tree: both sides run the same code.
    "ingest_side_by_side.py": Smoke(f"--base {REPO} --hosts 2 --rounds 1 --pairs 1", ("postgres",)),
    "ingest_instructions.py": Smoke(f"--base {REPO} --hosts 2 --processes 20 --warm 1 --rounds 1",
                                    ("postgres", "valgrind")),
    "kill_latency.py": Smoke("--requests 2 --broker redis", ("redis",)),
    # Polls every 0.5 s: the admins' htmx polls run within the one second, not only their first loads.
    "load.py": Smoke("--seconds 1 --admins 2 --rate 5 --hosts 3 --poll-seconds 0.5", ("postgres", "redis")),
    # The smallest group: mutmut for real, 34 mutants of kills/states.py against its tests.
    "mutation.py": Smoke("states --out {tmp}/mutation.json --workdir {tmp}/copies"),
    "nvml_check.py": Smoke(""),  # no GPU here: it says so and exits 0
    "pages.py": Smoke("--hosts 2 --big-holders 10 --repeats 1 --no-wait"),
    "probe_vs_manual.py": Smoke("--processes 40 --device-holders 2 --repeats 1"),
    "snapshot_budget.py": Smoke("--workers 5"),
    "snapshot_updates.py": Smoke("--hosts 3 --gpus 1 --processes 5 --rounds 1 --batch 2 --database sqlite "
                                 "--no-wait"),
    # One pass of its loop (an RSS sample and a kill; the browser polls meanwhile), then the last sample.
    "soak.py": Smoke("--minutes 0.05 --kill-every 3 --sample-seconds 3 --browsers 1 --probe-interval 1"),
    # --updates: its steady round is full snapshots, so both paths run.
    "statement_costs.py": Smoke("--hosts 2 --rounds 1 --updates", ("postgres",)),
    "usage_settle.py": Smoke("--hosts 2 --no-wait", ("postgres",)),
    "update_consumption.py": Smoke("--messages 50 --repeats 1 --no-wait", ("redis",)),
    "validation_paths.py": Smoke("--repeats 1"),
}


@dataclass(frozen=True)
class Interruption:
    script: str
    args: str  # split on spaces
    children: int  # the script's own children, at least, when it is interrupted
    needs: tuple[str, ...] = ()
    # Interrupted once a kill target (kill_latency.TARGET, a child of the script) is up: the script is
    # then in its kill loop, every server and worker ready, and its cleanup must stop the target too.
    # Otherwise, as soon as `children` are up (no fixed wait: whatever they are doing, they must go).
    in_kill_loop: bool = False


INTERRUPTIONS = {
    # redis-server and two Celery workers just started, each in its own group (its request loop would
    # first wait for both workers to be ready: 5-15 s more on the development VM).
    "kill_latency": Interruption("kill_latency.py", "--requests 1000", 3, ("redis",)),
    # load.py (PostgreSQL, redis-server, `python -m gpuadmin.run`), already loading, then the two workers
    # (embedded broker) just started: kill_latency.py stops them, then load.py with SIGINT mid-load
    # (load.py's Ctrl+C in its main phase).
    "kill_latency_under_load": Interruption(
        "kill_latency.py", "--requests 1000 --broker embedded --under-load --load-admins 2 --load-rate 5 "
        "--load-hosts 3", 3, ("postgres", "redis")),
    # The GPU holder, `python -m gpuadmin.run` (its own supervisor of gunicorn and Celery, serving the
    # simulated browsers) and a target (one every 5 s). Once only the first two were waited for, and
    # the holder and `manage.py migrate` were two: Ctrl+C came before gpuadmin.run had started.
    "soak": Interruption("soak.py", "--minutes 60 --probe-interval 1 --kill-every 5", 3, in_kill_loop=True),
    # PostgreSQL, redis-server and `python -m gpuadmin.run` just started: Ctrl+C during the start-up
    # (mid-load it is kill_latency_under_load's).
    "load": Interruption("load.py", "--seconds 600 --admins 2 --rate 5 --hosts 3", 3, ("postgres", "redis")),
}


def kill_targets(children: list[int]) -> list[int]:
    found = []
    for pid in children:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if TARGET.encode() in argv:
            found.append(pid)
    return found


def require(needs: tuple[str, ...]) -> None:
    """Skip (or fail, under GPUADMIN_REQUIRE_SERVICES=1) when a server the script starts is not installed."""
    try:
        if "postgres" in needs:
            services.find_binary("initdb", glob.glob(services.POSTGRES_BIN_GLOB))
        if "redis" in needs:
            services.find_binary("redis-server")
        if "valgrind" in needs:
            services.find_binary("callgrind_control")
    except services.ServiceMissing as exc:
        services.missing(str(exc))


def script_env() -> dict[str, str]:
    # As from a shell: none of the test worker's settings (tests/environment.py: its data dir, the
    # central key its agents pin), database or broker; each script makes its own. Nor coverage's
    # (COVERAGE_PROCESS_CONFIG, which starts it in every subprocess): the scripts run at volume what
    # the tests cover, and its tracer's cost is a tax on every run (tests/README.md: the figures).
    drop = {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    return {key: value for key, value in os.environ.items()
            if key not in drop and not key.startswith(("GPUADMIN_", "COVERAGE_"))}


def test_every_script_has_a_smoke_run() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py")} - NOT_SCRIPTS
    assert scripts == set(SMOKE), "a script in benchmarks/ without its smoke run here, or the reverse"


def run_script(script: str, args: list[str]) -> str:
    """Run ``benchmarks/<script>`` under the harness; its output, once it exited 0 and left nothing."""
    run = SupervisedRun([sys.executable, str(BENCHMARKS / script), *args], script_env()).start()
    try:
        status, leftovers = run.finish(RUN_TIMEOUT_SECONDS)
    finally:
        run.kill_everything(set())
    assert status == 0, run.output[-6000:]
    assert leftovers == [], f"{script} left processes behind: {leftovers}\n{run.output[-3000:]}"
    return run.output


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_script_runs_and_leaves_nothing(script: str, tmp_path: Path) -> None:
    smoke = SMOKE[script]
    require(smoke.needs)
    run_script(script, smoke.args.replace("{tmp}", str(tmp_path)).split())


def test_statement_costs_timer_reports_the_timers_full_snapshots_only() -> None:
    """``--timer``, beside the smoke run's ``--updates``: the period's rounds of updates, then the full
    snapshots the agents' timer sends; the script itself exits non-zero if a round mixed the two."""
    require(("postgres",))
    output = run_script("statement_costs.py", ["--hosts", "2", "--rounds", "1", "--timer"])
    assert "2 snapshots; CPU per snapshot:" in output, output[-3000:]
    assert 'INSERT INTO "fleet_latestsnapshot"' in output, output[-3000:]


# SIGTERM takes the same path as SIGINT (benchmarks/processes.py: SystemExit for KeyboardInterrupt, the
# same finally blocks): one script shows it. kill_latency.py alone is interrupted with SIGTERM only, as
# its SIGINT would take the same path as its SIGTERM; its SIGINT path is kill_latency_under_load's.
SIGNALS = [*((name, signal.SIGINT) for name in sorted(INTERRUPTIONS) if name != "kill_latency"),
           ("kill_latency", signal.SIGTERM)]


@pytest.mark.parametrize(("name", "signum"), SIGNALS,
                         ids=[f"{name}-{signal.Signals(signum).name}" for name, signum in SIGNALS])
def test_interrupted_script_leaves_nothing(name: str, signum: int) -> None:
    case = INTERRUPTIONS[name]
    require(case.needs)
    argv = [sys.executable, str(BENCHMARKS / case.script), *case.args.split()]
    run = SupervisedRun(argv, script_env()).start()
    try:
        pid = run.command_pid
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            started = children_of(pid)
            if len(started) >= case.children and (not case.in_kill_loop or kill_targets(started)):
                break
            assert time.monotonic() < deadline, f"{case.script} did not reach its main phase:\n{run.output}"
            assert run.process is not None and run.process.poll() is None, run.output
            time.sleep(PHASE_POLL_SECONDS)
        os.kill(pid, signum)
        status, leftovers = run.finish(RUN_TIMEOUT_SECONDS)
    finally:
        run.kill_everything(set())
    assert leftovers == [], f"{case.script} left processes behind: {leftovers}\n{run.output[-3000:]}"
    assert status != 0 or name == "load", run.output[-3000:]  # load.py reports what it measured on Ctrl+C
    assert f"{signal.Signals(signum).name} received" in run.output, run.output[-3000:]
    assert not [p for p in started if Path(f"/proc/{p}").exists()], "a child of the script is still running"
