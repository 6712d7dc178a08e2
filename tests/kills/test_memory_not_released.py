"""After a kill, memory that does not come back within GPUADMIN_MEMORY_RELEASE_SNAPSHOTS snapshots: the
request's page says so, and a finding names what still holds it and the next step, until it comes back."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest

from gpuadmin.fleet.models import Finding, Host
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from tests.factories import GiB
from tests.kills.helpers import GPU0, KILLED, lab_snapshot, refreshed
from tests.people import client_for

pytestmark = pytest.mark.django_db

def snapshot_after(kill_request: KillRequest, seconds: float, *, stuck_bytes: int) -> None:
    """A snapshot ``seconds`` after the kill finished: its targets gone, ``stuck_bytes`` held by no one."""
    document = lab_snapshot(drop=KILLED, extra_used={GPU0: stuck_bytes} if stuck_bytes else None)
    taken_at = kill_request.finished_at + timedelta(seconds=seconds)
    document["taken_at"] = taken_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    services.confirm_released(Host.objects.get(name="gpu01"), document, now=taken_at)


def not_released() -> list[Finding]:
    return list(Finding.objects.open().filter(kind=Finding.Kind.MEMORY_NOT_RELEASED))


def test_memory_held_by_no_process_after_three_snapshots_is_called_not_released_with_a_reset_as_next_step(
    killed: KillRequest, viewer: Any, settings: Any
) -> None:
    settings.GPUADMIN_MEMORY_RELEASE_SNAPSHOTS = 3
    snapshot_after(killed, 5, stuck_bytes=18 * GiB)
    snapshot_after(killed, 10, stuck_bytes=18 * GiB)
    assert refreshed(killed).memory_confirmed_at is None and not not_released()

    snapshot_after(killed, 15, stuck_bytes=18 * GiB)

    kill_request = refreshed(killed)
    assert kill_request.memory_snapshots_compared == 3
    assert kill_request.memory_released_bytes == 0
    assert kill_request.memory_not_released_bytes == 18 * GiB
    (finding,) = not_released()
    assert finding.details["kill_request_id"] == killed.pk
    assert "18 GiB" in finding.title and "after 3 snapshot(s)" in finding.title
    assert "held by no process" in finding.remedy and "request a GPU reset" in finding.remedy
    page = client_for(viewer).get(f"/kills/{killed.pk}/").content.decode()
    assert "Memory not released" in page and "had not come back after 3 snapshots" in page
    host_page = client_for(viewer).get("/hosts/gpu01/").content.decode()
    assert "Request a GPU reset" not in host_page  # a viewer may not file one

    # The GPU reset (or whatever freed it): the next snapshot shows it back, and the finding closes.
    snapshot_after(killed, 20, stuck_bytes=0)
    assert not not_released()


def test_the_finding_offers_a_reset_request_to_a_requester(killed: KillRequest, requester: Any) -> None:
    for seconds in (5, 10, 15):
        snapshot_after(killed, seconds, stuck_bytes=18 * GiB)

    host_page = client_for(requester).get("/hosts/gpu01/").content.decode()

    assert f"/kills/reset/new/?host=gpu01&amp;gpu={GPU0}" in host_page


def test_memory_that_came_back_is_no_finding(killed: KillRequest) -> None:
    snapshot_after(killed, 5, stuck_bytes=0)

    assert refreshed(killed).memory_released_bytes == 18 * GiB
    assert refreshed(killed).memory_not_released_bytes == 0
    assert not not_released()
