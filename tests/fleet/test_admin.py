"""The fleet's Django admin shows what ingest stored and lets nobody edit it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin import site
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from gpuadmin.fleet.admin import ProcessLifeAdmin
from gpuadmin.fleet.models import Host, LatestSnapshot, ProcessLife
from tests.factories import GiB, gpu, proc, snapshot
from tests.fleet.helpers import at

pytestmark = pytest.mark.django_db

MODELS = [
    "host",
    "gpu",
    "latestsnapshot",
    "gpusample",
    "hostsample",
    "processlife",
    "finding",
    "snapshotrejection",
]


def holder() -> dict[str, Any]:
    return proc(4120, cmdline=["python", "<script>alert(1)</script>"], gpu_memory={"GPU-sim-0000": GiB})


@pytest.fixture
def admin_client_with_data(ingest: Callable[..., Host]) -> Client:
    zombies = [proc(p, ppid=4120, state="Z", cmdline=[]) for p in (4121, 4122)]
    ingest(snapshot("gpu01", processes=[holder(), *zombies], gpus=[gpu(0, used=GiB)], taken_at=at(0)))
    user = get_user_model().objects.create_superuser("root", password="pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", MODELS)
def test_changelists_show_and_nothing_can_be_added(admin_client_with_data: Client, model: str) -> None:
    response = admin_client_with_data.get(reverse(f"admin:fleet_{model}_changelist"))
    assert response.status_code == 200
    assert b"<script>alert(1)</script>" not in response.content
    assert admin_client_with_data.get(reverse(f"admin:fleet_{model}_add")).status_code == 403


def test_a_host_can_be_viewed_not_changed(admin_client_with_data: Client) -> None:
    host = Host.objects.get()
    url = reverse("admin:fleet_host_change", args=[host.pk])
    response = admin_client_with_data.get(url)
    assert response.status_code == 200
    assert b'name="_save"' not in response.content
    admin_client_with_data.post(url, {"name": "renamed"})
    assert Host.objects.get().name == "gpu01"


def test_the_latest_document_shows_indented_and_escaped(admin_client_with_data: Client) -> None:
    latest = LatestSnapshot.objects.get()
    response = admin_client_with_data.get(reverse("admin:fleet_latestsnapshot_change", args=[latest.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert "<script>alert(1)</script>" not in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content
    # One value a line, inside <pre>: readable, not one line of 125 KB.
    assert '<pre>{\n "schema_version": ' in content.replace("&quot;", '"')


def test_an_open_process_life_shows_as_last_seen_by_the_host_s_newest_snapshot(
    admin_client_with_data: Client, ingest: Callable[..., Host]
) -> None:
    ingest(snapshot("gpu01", processes=[holder()], gpus=[gpu(0, used=GiB)], taken_at=at(30)))
    life = ProcessLife.objects.select_related("host").get(pid=4120)
    assert life.last_seen_at == at(0)  # steady: not written again
    assert ProcessLifeAdmin(ProcessLife, site).last_seen(life) == at(30)
    response = admin_client_with_data.get(reverse("admin:fleet_processlife_changelist"))
    assert b"Last seen" in response.content
