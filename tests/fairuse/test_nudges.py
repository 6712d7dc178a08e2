"""Nudges: one person asks another to release a GPU, at most once per pair per interval; ignored
past its time it becomes a kill request that waits for an approver; released, it closes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from gpuadmin.fairuse import services
from gpuadmin.fairuse.models import Notice, Nudge
from gpuadmin.fairuse.states import NudgeState
from gpuadmin.kills.states import Status
from gpuadmin.notify.models import Account, Person
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=3)


def ingest(minutes: float, *, bob_holds: bool = True) -> None:
    processes = [proc(4300, uid=1001, user="bob", gpu_memory={"GPU-sim-0000": 4 * GiB})] if bob_holds else []
    deliver(snapshot("gpu01", taken_at=NOW + timedelta(minutes=minutes), gpus=[gpu(0, used=4 * GiB)],
                     processes=processes), received_at=NOW + timedelta(minutes=minutes))


@pytest.fixture
def people(viewer, stranger):
    alice = Person.objects.create(name="Alice", user=viewer)
    Account.objects.create(person=alice, uid=1000)
    bob = Person.objects.create(name="Bob", email="bob@lab.example", user=stranger)
    Account.objects.create(person=bob, uid=1001)
    return alice, bob


def test_an_ignored_nudge_becomes_a_kill_request_for_approvers(people, viewer, settings):
    settings.GPUADMIN_NUDGE_ESCALATE_MINUTES = 30
    ingest(0)
    sent = services.nudge(viewer, host="gpu01", pid=4300, start_time_ticks=430000, message="deadline",
                          now=NOW)
    (notice,) = Notice.objects.all()
    assert notice.person == people[1] and "Alice asks you to release" in notice.body
    ingest(29)
    assert services.evaluate(now=NOW + timedelta(minutes=29)) == 0
    ingest(31)
    services.evaluate(now=NOW + timedelta(minutes=31))
    sent.refresh_from_db()
    assert sent.status == NudgeState.ESCALATED
    assert sent.kill_request.status == Status.PENDING and sent.kill_request.requested_by_name == "nudges"


def test_a_released_gpu_closes_the_nudge(people, viewer, settings):
    settings.GPUADMIN_NUDGE_ESCALATE_MINUTES = 30
    ingest(0)
    sent = services.nudge(viewer, host="gpu01", pid=4300, start_time_ticks=430000, now=NOW)
    ingest(31, bob_holds=False)
    services.evaluate(now=NOW + timedelta(minutes=31))
    sent.refresh_from_db()
    assert sent.status == NudgeState.RELEASED and sent.kill_request is None


def test_one_nudge_per_pair_of_people_per_interval(people, viewer):
    ingest(0)
    services.nudge(viewer, host="gpu01", pid=4300, start_time_ticks=430000, now=NOW)
    with pytest.raises(services.NotAllowed, match="you nudged Bob less than 60 minutes ago"):
        services.nudge(viewer, host="gpu01", pid=4300, start_time_ticks=430000,
                       now=NOW + timedelta(minutes=5))
    assert Nudge.objects.count() == 1


def test_my_gpus_offers_to_nudge_the_others(people, viewer_client):
    ingest(0)
    page = viewer_client.get(reverse("my_gpus")).content.decode()
    assert "Ask to release PID 4300" in page
