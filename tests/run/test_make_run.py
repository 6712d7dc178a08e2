"""`python -m gpuadmin.run` for real: embedded (SQLite, filesystem broker), and on Redis + PostgreSQL.

Starts the whole thing on a free port with a temporary data dir and a
simulated GPU held by a real process, waits for the login page, sees the
worker's first snapshot (sent when the worker starts) land in the database,
checks that a queued message past its `expires` is dropped, then presses
Ctrl+C and checks that nothing it started is left: no process in its
children's process groups or sessions, no zombie, exit status 0. Then starts
again on the same data directory and gets a page.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.run.helpers import REPO, SupervisedRun, hosts_in, in_groups_or_sessions, zombies_of
from tests.services import free_port

HOST = "run-test"
GPU_UUID = "GPU-5e1f0000-0000-4000-8000-000000000001"
ENQUEUE = textwrap.dedent("""
    import sys
    from datetime import datetime, timedelta, timezone
    from gpuadmin.celery import app
    from gpuadmin.wire.task_names import INGEST_SNAPSHOT
    from tests.factories import snapshot
    from tests.keys import signed_snapshot
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    app.send_task(INGEST_SNAPSHOT, args=[signed_snapshot(snapshot(host="expired-host"))], expires=past)
    app.send_task(INGEST_SNAPSHOT, args=[signed_snapshot(snapshot(host="queued-host"))])
""")


ENQUEUE_AFTER_RESTART = textwrap.dedent("""
    from gpuadmin.celery import app
    from gpuadmin.wire.task_names import INGEST_SNAPSHOT
    from tests.factories import snapshot
    from tests.keys import signed_snapshot
    app.send_task(INGEST_SNAPSHOT, args=[signed_snapshot(snapshot(host="after-restart-host"))])
""")
# A host enrolled with a stored snapshot (in the run's database), and its agent's next message, a snapshot
# update, sent as agents send it: to central.updates, which the run's one worker takes too.
ENQUEUE_UPDATE = textwrap.dedent("""
    import tempfile
    from datetime import datetime, timedelta, timezone
    from pathlib import Path
    import django
    django.setup()
    from gpuadmin.sending import send_snapshot_update
    from tests.fleet.helpers import stored_with_updates
    state_path = Path(tempfile.mkdtemp()) / "agent-state.json"
    taken_at = datetime.now(timezone.utc) - timedelta(minutes=1)
    [update] = stored_with_updates("update-host", state_path, taken_at=taken_at)
    send_snapshot_update(update)
""")
WORKER = "worker (celery, with scheduler)"
T = TypeVar("T")


def poll(what: str, check: Callable[[], T | None], timeout_seconds: float, run: SupervisedRun) -> T:
    """``check``'s answer once it gives one (not None), asked every 0.2 s; AssertionError with the run's
    output when ``what`` did not happen within ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout_seconds} s:\n{run.output}")


def wait_for_hosts(env: dict[str, str], names: set[str], timeout_seconds: float, run: SupervisedRun,
                   *, known: set[str] = frozenset()) -> dict:
    """Hosts once each of ``names`` has a stored snapshot and each of ``known`` a row."""
    def stored() -> dict | None:
        hosts = hosts_in(env)
        done = names <= {name for name, document in hosts.items() if document} and known <= set(hosts)
        return hosts if done else None

    return poll(f"hosts {sorted(names)} stored", stored, timeout_seconds, run)


def update_sequence_in(env: dict[str, str], host_name: str) -> int:
    """The last snapshot update applied to the host's latest snapshot, read from the run's database."""
    query = ("SELECT s.update_sequence FROM fleet_latestsnapshot s JOIN fleet_host h ON s.host_id = h.id "
             "WHERE h.name = %s")
    if env.get("DATABASE_URL"):
        import psycopg

        with psycopg.connect(env["DATABASE_URL"]) as connection:
            [(sequence,)] = connection.execute(query, (host_name,)).fetchall()
        return int(sequence)
    database = Path(env["GPUADMIN_DATA_DIR"]) / "gpuadmin.sqlite3"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        [(sequence,)] = connection.execute(query.replace("%s", "?"), (host_name,)).fetchall()
    return int(sequence)


def http_get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


@pytest.fixture
def gpu_holder() -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield holder
    holder.kill()
    holder.wait()


@pytest.fixture(params=["embedded", pytest.param("redis+postgresql", marks=pytest.mark.services)])
def backends(request: pytest.FixtureRequest) -> dict[str, str]:
    """The environment that picks the broker and database: none (the default) or both servers."""
    if request.param == "embedded":
        return {}
    redis_server = request.getfixturevalue("redis_server")
    postgres_server = request.getfixturevalue("postgres_server")
    # A Redis database of its own: the integration tests' central worker shares the server.
    return {"REDIS_URL": f"redis://127.0.0.1:{redis_server.port}/3", "DATABASE_URL": postgres_server.url}


def test_make_run_serves_probes_and_leaves_nothing_behind_on_ctrl_c(
    tmp_path: Path, gpu_holder: subprocess.Popen, backends: dict[str, str]
) -> None:
    data_dir = tmp_path / "data"
    gpus_file = tmp_path / "gpus.json"
    gpus_file.write_text(json.dumps({
        "gpus": [{"uuid": GPU_UUID, "name": "Simulated H100", "memory_total_bytes": 80 * 2**30,
                  "extra_used_bytes": 0, "utilization_percent": 40}],
        "processes": [{"pid": gpu_holder.pid, "gpu_uuid": GPU_UUID, "used_memory_bytes": 3 * 2**30}],
    }))
    port = free_port()
    # Not the test run's central key: the run's agent pins the key of the run's own central.
    dropped = {"DATABASE_URL", "REDIS_URL", "GPUADMIN_CENTRAL_PUBLIC_KEY"}
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.update({
        "GPUADMIN_DATA_DIR": str(data_dir),
        "PORT": str(port),
        "GPUADMIN_HOST_NAME": HOST,
        "GPUADMIN_GPU_BACKEND": "simulated",
        "GPUADMIN_SIMULATED_GPUS": str(gpus_file),
        # No scheduled probe during the test: the host must come from the worker's start-up probe.
        "GPUADMIN_PROBE_INTERVAL": "3600",
        "GPUADMIN_WORKER_CONCURRENCY": "1",
        "GPUADMIN_ADMIN_USER": "boss",
        "GPUADMIN_ADMIN_PASSWORD": "correct horse battery",
        "GPUADMIN_STATIC_HASHED": "1",  # as `make run` has it: collectstatic's hashed, compressed files
        "GPUADMIN_TASK_LOG_LEVEL": "INFO",  # a line for each batch of snapshot updates
        **backends,
    })
    # Queued before anything runs, in the run's own filesystem broker: that needs the data
    # directory, so it is made first by the documented step (which `make run` repeats, finding it done).
    subprocess.run([sys.executable, "-m", "gpuadmin.data_dir"], env=env, cwd=REPO, check=True, timeout=60)
    subprocess.run([sys.executable, "-c", ENQUEUE], env=env, cwd=REPO, check=True, timeout=60)

    run = SupervisedRun([sys.executable, "-m", "gpuadmin.run"], env=env).start()
    children: dict[str, int] = {}
    try:
        run.wait_for_line(rf"gpuadmin is running at http://127\.0\.0\.1:{port}/", timeout_seconds=90)
        assert "created admin account 'boss'" in run.output
        children = run.started_children()
        assert set(children) == {"web server (gunicorn)", WORKER}, run.output

        status, body = http_get(f"http://127.0.0.1:{port}/login/")
        assert status == 200 and b"<form" in body
        status, body = http_get(f"http://127.0.0.1:{port}/static/vendor/htmx/htmx-2.0.11.min.js")
        assert status == 200 and b"htmx" in body  # whitenoise serves static files

        # This box's own agent is accepted by `make run`: its start-up snapshot is stored. A new
        # host's signed snapshot only offers its key: a row awaiting acceptance, nothing stored.
        hosts = wait_for_hosts(env, {HOST}, 60, run, known={"queued-host"})
        assert hosts["queued-host"] == {}
        assert "expired-host" not in hosts, "a message past its expiry was ingested"
        document = hosts[HOST]
        assert document["gpu_backend"]["name"] == "simulated"
        assert [gpu["uuid"] for gpu in document["gpus"]] == [GPU_UUID]
        holder = next(p for p in document["processes"] if p["pid"] == gpu_holder.pid)
        assert holder["gpu_memory_bytes"] == {GPU_UUID: 3 * 2**30}
        assert "probing every 3600 s" in run.output  # the agent's own clock: this one came at its start

        groups = set(children.values())
        running = in_groups_or_sessions(groups)
        # gunicorn's master and 2 workers, celery's main process, its pool and beat.
        assert len(running) >= 5, running

        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
        health = json.loads(body)
        assert (status, health["status"], health["supervisor_restarts"]) == (200, "ok", 0), health
        assert health["last_snapshot_at"] is not None

        # The worker dies: the supervisor restarts it and the panel stays up.
        os.kill(children[WORKER], signal.SIGKILL)
        run.wait_for_line(rf"^gpuadmin: restarting {re.escape(WORKER)} \(restart 1 since start\)$", 60)
        subprocess.run([sys.executable, "-c", ENQUEUE_AFTER_RESTART], env=env, cwd=REPO, check=True,
                       timeout=60)
        # The new worker consumes it: a new host's signed snapshot makes its row (awaiting acceptance).
        wait_for_hosts(env, set(), 90, run, known={"after-restart-host"})
        # It takes snapshot updates from their own queue too (one at a time on the embedded broker).
        subprocess.run([sys.executable, "-c", ENQUEUE_UPDATE], env=env, cwd=REPO, check=True, timeout=60)
        # Its update, not the run's own agent's (the restarted worker probes at once, and its agent, whose
        # last message was a full snapshot, may send an update too): read from the database.
        poll("update-host's update applied", lambda: update_sequence_in(env, "update-host") == 1 or None, 60,
             run)
        assert "applied a batch of" in run.output
        status, body = http_get(f"http://127.0.0.1:{port}/healthz")
        assert (status, json.loads(body)["supervisor_restarts"]) == (200, 1)
        running += in_groups_or_sessions({run.started_children()[WORKER]})
        groups.add(run.started_children()[WORKER])
        children = run.started_children()

        os.kill(run.command_pid, signal.SIGINT)
        exit_status, leftovers = run.finish(timeout_seconds=60)

        assert exit_status == 0, run.output
        assert "gpuadmin: SIGINT received" in run.output
        assert leftovers == [], run.output
        assert in_groups_or_sessions(groups) == [], run.output
        assert zombies_of(groups | {p.pid for p in running} | {run.command_pid}) == []

        # Day two: the same data directory starts again (collectstatic's files once made it refuse).
        run = SupervisedRun([sys.executable, "-m", "gpuadmin.run"], env=env).start()
        run.wait_for_line(rf"gpuadmin is running at http://127\.0\.0\.1:{port}/", timeout_seconds=90)
        status, body = http_get(f"http://127.0.0.1:{port}/login/")
        assert status == 200 and b"<form" in body
        os.kill(run.command_pid, signal.SIGINT)
        exit_status, leftovers = run.finish(timeout_seconds=60)
        assert (exit_status, leftovers) == (0, []), run.output
    finally:
        run.kill_everything(set(children.values()) | set(run.started_children().values()))


def test_make_run_prepares_a_missing_data_dir_before_anything_loads_the_settings(tmp_path: Path) -> None:
    # A database that refuses connections stops the run at its first migration, right after
    # the data directory step: enough to see that step done, without starting the children.
    data_dir = tmp_path / "data"
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUADMIN_SECRET_KEY")}
    env.update({"GPUADMIN_DATA_DIR": str(data_dir), "PORT": str(free_port()),
                "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    done = subprocess.run([sys.executable, "-m", "gpuadmin.run"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "ImproperlyConfigured" not in done.stderr, done.stderr
    assert "OperationalError" in done.stderr, done.stderr
    assert (data_dir / "secret_key").stat().st_mode & 0o777 == 0o600
    assert data_dir.stat().st_mode & 0o777 == 0o700
