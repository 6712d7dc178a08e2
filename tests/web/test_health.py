"""/healthz and the footer's restart count: what a process manager or a person sees of the panel's health."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.test import Client

from gpuadmin.broker.filesystem import BrokerFolders
from gpuadmin.celery import app
from gpuadmin.data_dir import supervisor_state_path
from tests.fleet.helpers import store
from tests.services import free_port

pytestmark = pytest.mark.django_db
KEYS = {"status", "web", "database", "broker", "last_snapshot_at", "last_snapshot_age_seconds",
        "supervisor_restarts"}


def get_health(client: Client) -> tuple[int, dict]:
    response = client.get("/healthz")
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    return response.status_code, json.loads(response.content)


@pytest.fixture
def supervisor_state() -> Iterator[Path]:
    """A supervisor state file as `make run` publishes it, by a live process (this one)."""
    path = supervisor_state_path(django_settings.DATA_DIR)
    path.write_text(json.dumps({"pid": os.getpid(), "started_at": 1_700_000_000.0, "restarts": 2,
                                "children": {"worker (celery, with scheduler)": 2}}))
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def broker_url() -> Iterator[Callable[[str], None]]:
    """Point the Celery app at another broker for one test."""
    saved = (app.conf.broker_url, app.conf.broker_transport)

    def use(url: str) -> None:
        app.conf.broker_url, app.conf.broker_transport = url, None

    yield use
    app.conf.broker_url, app.conf.broker_transport = saved


def test_healthz_needs_no_login_and_says_what_answers(client: Client) -> None:
    status, health = get_health(client)
    assert status == 200
    assert health == {"status": "ok", "web": "ok", "database": "ok", "broker": "ok",
                      "last_snapshot_at": None, "last_snapshot_age_seconds": None,
                      "supervisor_restarts": None}


def test_healthz_tells_when_the_last_snapshot_arrived_and_nothing_of_it(client: Client) -> None:
    host = store("gpu-secret-name")
    status, health = get_health(client)
    assert status == 200 and set(health) == KEYS
    assert health["last_snapshot_at"] == host.last_seen_at.isoformat()
    assert 0 <= health["last_snapshot_age_seconds"] < 3600
    assert b"gpu-secret-name" not in client.get("/healthz").content


def test_healthz_is_503_when_the_embedded_broker_is_unusable(client: Client) -> None:
    if django_settings.CELERY_BROKER_URL.startswith("redis"):
        pytest.skip("the embedded broker is not in use")
    folders = BrokerFolders.from_options(django_settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    folders.create()
    parked = folders.queue.with_name("queue-parked")
    folders.queue.rename(parked)
    folders.queue.write_text("")  # a file where the folder should be
    try:
        status, health = get_health(client)
    finally:
        folders.queue.unlink()
        parked.rename(folders.queue)
    assert status == 503
    assert (health["status"], health["broker"], health["database"]) == ("failing", "failing", "ok")


def test_healthz_is_503_when_redis_does_not_answer(client: Client, broker_url) -> None:
    broker_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    status, health = get_health(client)
    assert status == 503
    assert (health["status"], health["broker"]) == ("failing", "failing")


@pytest.mark.services
def test_healthz_is_200_when_redis_answers(client: Client, broker_url, redis_server) -> None:
    broker_url(f"redis://127.0.0.1:{redis_server.port}/5")
    status, health = get_health(client)
    assert (status, health["broker"]) == (200, "ok")


def test_healthz_and_the_footer_show_the_supervisors_restart_count(
    client: Client, viewer_client: Client, supervisor_state: Path
) -> None:
    status, health = get_health(client)
    assert (status, health["supervisor_restarts"]) == (200, 2)
    page = viewer_client.get("/").content.decode()
    assert '<span class="supervisor-restarts">2 restarts</span>' in page
    assert "supervisor-restarts" not in client.get("/login/").content.decode()  # not shown to strangers


def test_a_state_file_left_by_a_dead_supervisor_is_ignored(client: Client, supervisor_state: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    state = json.loads(supervisor_state.read_text())
    supervisor_state.write_text(json.dumps({**state, "pid": int(gone.stdout)}))
    status, health = get_health(client)
    assert (status, health["supervisor_restarts"]) == (200, None)
