"""Two central workers on two data directories share one PostgreSQL and one redis-server.

As on two central machines (docs/deploy.md, "Growing beyond one box"): each worker has its own
GPUADMIN_DATA_DIR, holding the same secret key and central signing key, and both consume the `central`
queue. Signed snapshots of several hosts, sent through the broker in rounds as agents send them, are
each ingested exactly once by one worker or the other, and every host ends at its newest snapshot; a
snapshot older than the one stored is refused whichever worker gets it (ingest's order guard).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpuadmin.data_dir import CENTRAL_SIGNING_KEY, KEY_FILE
from tests import services
from tests.integration.helpers import REPO, Worker

pytestmark = [pytest.mark.services]

HOSTS = 6
ROUNDS = 4

# Run with DATABASE_URL and REDIS_URL set: migrates, enrols the hosts, sends their snapshots round by
# round (the next round once every host stored this one, as an agent's probe interval spaces them),
# then one stale snapshot; prints the tasks it sent.
SENDER = r"""
import json, time
from datetime import UTC, datetime, timedelta
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.fleet.models import Host
from gpuadmin.wire.task_names import INGEST_SNAPSHOT
from tests.factories import snapshot
from tests.keys import enrol, signed_snapshot

HOSTS, ROUNDS = %(hosts)d, %(rounds)d
names = [f"gpu{n:02d}" for n in range(HOSTS)]
for name in names:
    enrol(Host.objects.create(name=name))
start = datetime.now(UTC) - timedelta(minutes=5)
sent = {}


def send(name, taken_at):
    result = app.send_task(INGEST_SNAPSHOT, args=[signed_snapshot(snapshot(name, taken_at=taken_at))],
                           queue=CENTRAL_QUEUE)
    sent[result.id] = name


def stored():
    return {h.name: h.last_snapshot_taken_at for h in Host.objects.filter(name__in=names)}


for round_number in range(ROUNDS):
    taken_at = start + timedelta(seconds=10 * round_number)
    for name in names:
        send(name, taken_at)
    deadline = time.monotonic() + 30
    while any(at != taken_at for at in stored().values()):
        assert time.monotonic() < deadline, f"round {round_number} not stored: {stored()}"
        time.sleep(0.05)
send(names[0], start - timedelta(seconds=5))  # older than any stored: must not take gpu00 back
print("RESULT " + json.dumps({"sent": sent, "stale": list(sent)[-1],
                              "stored": {n: at.isoformat() for n, at in stored().items()},
                              "newest": (start + timedelta(seconds=10 * (ROUNDS - 1))).isoformat()}))
"""

FINISHED = re.compile(r"Task gpuadmin\.fleet\.ingest_snapshot\[([0-9a-f-]+)\] succeeded in [0-9.e-]+s: (\S+)")


def finished_tasks(workers: list[Worker]) -> list[dict[str, str]]:
    """Each worker's finished ingest tasks: {task id: what it returned}."""
    return [dict(FINISHED.findall(worker.log)) for worker in workers]


def central_data_dir(path: Path, like: Path | None, env: dict[str, str]) -> Path:
    subprocess.run([sys.executable, "-m", "gpuadmin.data_dir"], env={**env, "GPUADMIN_DATA_DIR": str(path)},
                   cwd=REPO, check=True, capture_output=True)
    if like is not None:  # the files every central machine must share
        for name in (KEY_FILE, CENTRAL_SIGNING_KEY):
            shutil.copy2(like / name, path / name)
    return path


def test_two_central_workers_ingest_each_snapshot_once_and_in_order(tmp_path: Path) -> None:
    with services.redis_server() as redis, services.postgres_server() as postgres:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_"))}
        env.update({"DATABASE_URL": postgres.url, "REDIS_URL": redis.url,
                    "DJANGO_SETTINGS_MODULE": "gpuadmin.settings"})
        first = central_data_dir(tmp_path / "central-1", None, env)
        second = central_data_dir(tmp_path / "central-2", first, env)
        workers = []
        try:
            for number, data_dir in ((1, first), (2, second)):
                argv = [sys.executable, "-m", "celery", "-A", "gpuadmin", "worker", "-Q", "central",
                        "-n", f"central{number}-{uuid.uuid4().hex[:6]}@%h", "--concurrency", "1",
                        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]
                workers.append(Worker(f"central-{number}", argv,
                                      {**env, "GPUADMIN_DATA_DIR": str(data_dir),
                                       "GPUADMIN_HOST_NAME": f"central-{number}",
                                       "GPUADMIN_TASK_LOG_LEVEL": "INFO"},  # a line for each task
                                      tmp_path / f"central-{number}.log"))
            for worker in workers:
                worker.wait_ready()
            ran = subprocess.run([sys.executable, "-c", SENDER % {"hosts": HOSTS, "rounds": ROUNDS}],
                                 env={**env, "GPUADMIN_DATA_DIR": str(first)}, cwd=REPO,
                                 capture_output=True, text=True, timeout=120, check=False)
            logs = "\n".join(f"--- {w.name}\n{w.log[-4000:]}" for w in workers)
            assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:] + logs
            out = json.loads(ran.stdout.split("RESULT ", 1)[1])
            stale = out["stale"]
            deadline = time.monotonic() + 10
            # The stale one is the last message: wait for its outcome.
            finished = finished_tasks(workers)
            while not any(stale in each for each in finished):
                assert time.monotonic() < deadline, logs
                time.sleep(0.1)
                finished = finished_tasks(workers)
            logs = "\n".join(f"--- {w.name}\n{w.log[-4000:]}" for w in workers)
        finally:
            for worker in workers:
                services.stop_process_group(worker.process)
    sent = out["sent"]
    ingested = {task_id: name for task_id, name in sent.items() if task_id != stale}
    # Each message finished once, on one worker or the other, and both workers took a share.
    assert not set(finished[0]) & set(finished[1]), logs
    done = {**finished[0], **finished[1]}
    assert set(done) == set(sent), logs
    assert all(done[task_id] == repr(name) for task_id, name in ingested.items()), logs
    assert all(finished), f"one worker ingested nothing: {[len(f) for f in finished]}"
    # The stale snapshot was handled once, whichever worker had it, and nothing went back in time.
    assert stale in done
    assert set(out["stored"].values()) == {out["newest"]}
    assert len(out["stored"]) == HOSTS and len(ingested) == HOSTS * ROUNDS
