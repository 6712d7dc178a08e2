"""The pages: "My GPUs" lists a person's own GPU processes and stops one with no approver, and
refuses another person's (central's uid check); a case's "still needed" answer; a policy's dry run."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from gpuadmin.fairuse.models import Policy
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.notify.models import Account, Person
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver

pytestmark = pytest.mark.django_db
GPU0 = "GPU-sim-0000"


@pytest.fixture
def fleet(viewer, stranger):
    alice = Person.objects.create(name="Alice", user=viewer)
    Account.objects.create(person=alice, uid=1000)
    bob = Person.objects.create(name="Bob", user=stranger)
    Account.objects.create(person=bob, uid=1001, name="bob")
    deliver(snapshot("gpu01", gpus=[gpu(0, used=12 * GiB)], processes=[
        proc(4120, uid=1000, user="alice", cmdline=["python", "mine.py"], gpu_memory={GPU0: 8 * GiB}),
        proc(4300, uid=1001, user="bob", cmdline=["python", "theirs.py"], gpu_memory={GPU0: 4 * GiB}),
    ]))


def test_my_gpus_lists_my_processes_and_not_another_persons(fleet, viewer_client):
    page = viewer_client.get(reverse("my_gpus")).content.decode()
    mine, others = page.split('id="others"')
    assert "mine.py" in mine and "Stop PID 4120" in mine
    assert "theirs.py" not in mine and "Stop PID 4300" not in page
    assert "theirs.py" in others


def test_i_stop_my_own_process_with_no_approver(fleet, viewer_client, sent):
    response = viewer_client.post(reverse("stop_mine"), {"host": "gpu01", "pid": 4120,
                                                         "start_time_ticks": 412000})
    kill_request = KillRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("kill_request_detail",
                                                                           args=[kill_request.pk])
    assert kill_request.status == Status.APPROVED and kill_request.self_service


def test_i_cannot_stop_another_persons_process(fleet, viewer_client, sent):
    response = viewer_client.post(reverse("stop_mine"), {"host": "gpu01", "pid": 4300,
                                                         "start_time_ticks": 430000}, follow=True)
    assert "not yours on gpu01" in response.content.decode()
    assert not KillRequest.objects.exists() and sent.orders() == []


def test_a_policy_page_shows_its_dry_run(fleet, viewer_client):
    policy = Policy.objects.create(name="idle", condition=Policy.Condition.IDLE_HOLDER, minutes=1)
    page = viewer_client.get(reverse("fair_use_policy", args=[policy.pk])).content.decode()
    assert "Dry run" in page and "would have done nothing" in page  # no idle history yet
    # How finely the older days are read, so that an admin is not misled by a run's times.
    resolution = page.split('id="dry-run-resolution">')[1].split("</p>")[0]
    assert "raw samples" in resolution and "5-minute buckets" in resolution
    assert "30-minute buckets" in resolution


def test_my_gpus_needs_a_login_and_says_when_no_person_is_linked(client, viewer_client):
    assert client.get(reverse("my_gpus"))["Location"].startswith(reverse("login"))
    page = viewer_client.get(reverse("my_gpus")).content.decode()
    assert "not linked to a person" in page
    response = viewer_client.post(reverse("stop_mine"), {"host": "gpu01", "pid": 1, "start_time_ticks": 1},
                                  follow=True)
    assert not KillRequest.objects.exists() and response.status_code == 200


def test_my_gpus_reads_the_fleet_a_batch_of_hosts_at_a_time_in_the_same_queries_however_many(
        fleet, monkeypatch):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpuadmin.fairuse.people import processes_of
    from gpuadmin.fleet import models as fleet_models

    alice = Person.objects.get(name="Alice")

    def mine() -> tuple[list[tuple[str, int, tuple[int, ...]]], int]:
        with CaptureQueriesContext(connection) as queries:
            held = processes_of(alice, timezone.now())
        return [(h.host.name, h.row.pid, h.gpu_indexes) for h in held], len(queries.captured_queries)

    one_host = mine()
    for name in ("gpu02", "gpu03"):
        deliver(snapshot(name, gpus=[gpu(0, used=8 * GiB)], processes=[
            proc(5120, uid=1000, user="alice", cmdline=["python", "mine.py"], gpu_memory={GPU0: 8 * GiB})]))
    held, queries = mine()
    assert held == [("gpu01", 4120, (0,)), ("gpu02", 5120, (0,)), ("gpu03", 5120, (0,))]
    assert queries == one_host[1]  # the people directory and the processes read for all hosts at once
    monkeypatch.setattr(fleet_models, "HOSTS_PER_READ", 1)
    assert mine()[0] == held
