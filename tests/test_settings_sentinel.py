"""REDIS_URL=sentinel://...: the broker is the master a real Redis Sentinel names (gpuadmin/settings.py).

Run in subprocesses, as the settings are read once from the environment at start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests import services

REPO = Path(__file__).resolve().parents[1]
MASTER = "gpuadmin-broker"
SEND = "from gpuadmin.celery import app; app.send_task('gpuadmin.tests.sentinel_probe', queue='central')"
# Central's worker takes snapshot updates through the same transport (gpuadmin/broker/redis_taking.py).
TAKE = """
from gpuadmin.broker.redis_taking import RedisTaker
from gpuadmin.celery import app
with app.connection_for_write() as connection:
    channel = connection.channel()
    assert RedisTaker.serves(channel)
    taker = RedisTaker(channel, 'central')
    taken = taker.take(5)
    for message in taken:
        message.ack()
    taker.send_acks()
    print('took', [message.headers['task'] for message in taken])
"""


def run(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "GPUADMIN_REDIS_"))}
    environment.update({"DJANGO_SETTINGS_MODULE": "gpuadmin.settings", **env})
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {script}"], cwd=REPO,
                          env=environment, capture_output=True, text=True, timeout=60, check=False)


def test_a_sentinel_url_without_the_master_s_name_is_refused(tmp_path: Path) -> None:
    ran = run(tmp_path, "", REDIS_URL="sentinel://127.0.0.1:26379")
    assert ran.returncode != 0
    assert "needs GPUADMIN_REDIS_SENTINEL_MASTER" in ran.stderr


@pytest.mark.services
def test_tasks_go_to_and_are_taken_from_the_master_the_sentinel_names(tmp_path: Path) -> None:
    try:
        broker = services.redis_server()
        server = broker.__enter__()
    except services.ServiceMissing as exc:
        services.missing(str(exc))
    sentinel = None
    try:
        port = services.free_port()
        config = tmp_path / "sentinel.conf"  # Sentinel rewrites its file: its own, writable
        config.write_text(
            f"port {port}\nbind 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {server.port} 1\n")
        sentinel = subprocess.Popen([services.find_binary("redis-server"), str(config), "--sentinel"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    start_new_session=True)
        services.wait_for_port(port, sentinel, "redis-sentinel", tmp_path / "sentinel.log")
        ran = run(tmp_path, SEND, REDIS_URL=f"sentinel://127.0.0.1:{port}",
                  GPUADMIN_REDIS_SENTINEL_MASTER=MASTER)
        assert ran.returncode == 0, ran.stderr[-4000:]
        master = redis.Redis(port=server.port)
        assert master.llen("central") == 1

        took = run(tmp_path, TAKE, REDIS_URL=f"sentinel://127.0.0.1:{port}",
                   GPUADMIN_REDIS_SENTINEL_MASTER=MASTER)
        assert took.returncode == 0, took.stderr[-4000:]
        assert "took ['gpuadmin.tests.sentinel_probe']" in took.stdout
        assert (master.llen("central"), master.hlen("unacked")) == (0, 0)
    finally:
        if sentinel is not None:
            services.stop_process_group(sentinel)
        broker.__exit__(None, None, None)
