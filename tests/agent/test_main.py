"""python -m gpuadmin.agent: configured from the environment, exit 2 when something is missing;
for real, on a password-protected redis-server, with Celery's remote control off."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.db import connection
from kombu import Connection

from gpuadmin.celery import app, host_queue
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.wire.task_names import PROBE_HOST
from tests import services
from tests.integration.helpers import REPO, Worker, database_url_for_workers
from tests.services import stop_process_group

CENTRAL_KEY = os.environ["GPUADMIN_CENTRAL_PUBLIC_KEY"]
TIMEOUT_SECONDS = 60


def run_agent(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuadmin.agent"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("GPUADMIN_", "REDIS_"))}
    env.update({"GPUADMIN_HOST_NAME": "gpu07", "REDIS_URL": "redis://127.0.0.1:1/0",
                "GPUADMIN_CENTRAL_PUBLIC_KEY": CENTRAL_KEY, "GPUADMIN_DATA_DIR": str(tmp_path / "agent")})
    return env


@pytest.mark.parametrize(("change", "message"), [
    ({"GPUADMIN_HOST_NAME": None}, "missing GPUADMIN_HOST_NAME"),
    ({"REDIS_URL": None}, "missing REDIS_URL"),
    ({"GPUADMIN_CENTRAL_PUBLIC_KEY": None}, "missing GPUADMIN_CENTRAL_PUBLIC_KEY"),
    ({"GPUADMIN_DATA_DIR": None}, "missing GPUADMIN_DATA_DIR"),
    ({"GPUADMIN_CENTRAL_PUBLIC_KEY": "ed25519:short"}, "GPUADMIN_CENTRAL_PUBLIC_KEY"),
    ({"GPUADMIN_CENTRAL_PUBLIC_KEY": None, "GPUADMIN_CENTRAL_PUBLIC_KEY_FILE": "/nonexistent"},
     "cannot be read"),
    ({"REDIS_URL": "amqp://x"}, "redis:// or rediss://"),
    ({"GPUADMIN_AGENT_PROTECTED_EXECUTABLES": "[broken"}, "not a JSON list"),
])
def test_a_missing_or_wrong_setting_stops_the_agent_with_status_2(tmp_path: Path, change, message) -> None:
    env = base_env(tmp_path)
    for name, value in change.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    done = run_agent(env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "agent").exists()  # nothing written before the check passed


@pytest.fixture(params=[False, True], ids=["redis", "rediss"])
def redis_with_password(request: pytest.FixtureRequest) -> Iterator[services.RedisServer]:
    """A password-protected redis-server; the second time over TLS only, its certificate
    signed by a CA made for the test, which the URL names (rediss://...?ssl_ca_certs=)."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(services.redis_server(password="s3cret-pass", tls=request.param))
        except services.ServiceMissing as exc:
            services.missing(str(exc))
        yield server


@pytest.mark.services
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_agent_works_through_a_password_protected_redis_and_ignores_remote_control(
    tmp_path: Path, redis_with_password: services.RedisServer,
) -> None:
    url = redis_with_password.url
    assert ":s3cret-pass@" in url
    host_name = f"agent-{uuid.uuid4().hex[:8]}"
    env = base_env(tmp_path) | {"GPUADMIN_HOST_NAME": host_name, "REDIS_URL": url,
                                "GPUADMIN_GPU_BACKEND": "none"}
    central_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {
        "REDIS_URL": url, "GPUADMIN_HOST_NAME": f"central-{host_name}"}
    if connection.vendor != "sqlite":
        central_env["DATABASE_URL"] = database_url_for_workers()
    central = Worker("central", [sys.executable, "-m", "celery", "-A", "gpuadmin", "worker", "-Q", "central",
                                 "-n", f"central-{host_name}@%h", "--concurrency", "1", "--loglevel", "INFO",
                                 "--without-gossip",
                                 "--without-mingle"], central_env, tmp_path / "central.log")
    agent = Worker("agent", [sys.executable, "-m", "gpuadmin.agent", "--concurrency", "1"], env,
                   tmp_path / "agent.log")
    try:
        central.wait_ready()
        agent.wait_ready()
        match = re.search(r"fingerprint (SHA256:\S+)", agent.log)
        assert match, agent.log
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while not Host.objects.filter(name=host_name).exclude(public_key="").exists():
            assert time.monotonic() < deadline, agent.log + central.log
            time.sleep(0.2)
        trust.accept_host(host_name, actor_name="test", expected_fingerprint=match[1])
        with Connection(url) as broker:
            app.send_task(PROBE_HOST, queue=host_queue(host_name), expires=30, connection=broker)
            while not LatestSnapshot.objects.filter(host__name=host_name).exists():
                assert time.monotonic() < deadline, agent.log + central.log
                time.sleep(0.2)
        # A worker with remote control binds a queue to the broadcast exchange (pidbox); neither
        # binds one, so no broadcast command ever reaches them (tests/integration/test_remote_control.py).
        assert not redis.Redis.from_url(url).smembers("_kombu.binding.celery.pidbox")
        assert (tmp_path / "agent" / "agent_signing_key").stat().st_mode & 0o777 == 0o600
        assert not (tmp_path / "agent" / "central_signing_key").exists()
    finally:
        for worker in (agent, central):
            stop_process_group(worker.process)


CONNECT = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")
from gpuadmin.celery import app
try:
    with app.connection_for_write() as broker:
        broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        with broker.SimpleQueue("tls-check") as queue:
            queue.put({"over": "tls"})
            print("connected", queue.get(timeout=10).payload)
except Exception as error:
    print("refused", error)
    sys.exit(1)
"""


@pytest.fixture
def redis_over_tls() -> Iterator[services.RedisServer]:
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(services.redis_server(password="s3cret-pass", tls=True))
        except services.ServiceMissing as exc:
            services.missing(str(exc))
        yield server


@pytest.mark.services
def test_rediss_verifies_the_broker_s_certificate_against_the_configured_ca(
    tmp_path: Path, redis_over_tls: services.RedisServer,
) -> None:
    """GPUADMIN_REDIS_CA_FILE (or ssl_ca_certs in the URL, as above) names the lab's CA; a
    certificate another CA signed, or one the system's CAs do not know, is refused."""
    from gpuadmin.data_dir import prepare_data_dir

    other_ca, _, _ = services.make_tls_files(tmp_path, "localhost")
    env = base_env(tmp_path) | {"REDIS_URL": f"rediss://:s3cret-pass@localhost:{redis_over_tls.port}/0"}
    prepare_data_dir(Path(env["GPUADMIN_DATA_DIR"]), central=False)

    def connect(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CONNECT], env=env | extra, cwd=REPO,
                              capture_output=True, text=True, timeout=120, check=False)

    trusted = connect(GPUADMIN_REDIS_CA_FILE=str(redis_over_tls.ca_file))
    assert trusted.returncode == 0 and "connected {'over': 'tls'}" in trusted.stdout, trusted.stderr
    for refused in (connect(GPUADMIN_REDIS_CA_FILE=str(other_ca)), connect()):
        assert refused.returncode == 1, refused.stdout
        assert "CERTIFICATE_VERIFY_FAILED" in refused.stdout, refused.stdout + refused.stderr
