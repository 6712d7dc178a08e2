"""The host page's "Probe now" button sends an on-demand probe through the real broker."""

from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.messages import get_messages
from django.urls import reverse

from gpuadmin.broker.filesystem import BrokerFolders
from gpuadmin.fleet.models import Host
from tests.fleet.helpers import make_offline, store

pytestmark = pytest.mark.django_db

URL = reverse("host_probe", kwargs={"name": "gpu01"})


def filesystem_queue() -> Path:
    if not django_settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("these tests use the embedded filesystem broker (REDIS_URL is set)")
    folders = BrokerFolders.from_options(django_settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    folders.create()  # as the first connection would
    return folders.queue


def test_probe_now_sends_a_probe_and_says_so(viewer_client):
    queue = filesystem_queue()
    store("gpu01")
    before = set(queue.iterdir())
    response = viewer_client.post(URL)
    assert response.status_code == 302
    assert response["Location"] == reverse("host_detail", kwargs={"name": "gpu01"})
    assert Host.objects.get(name="gpu01").probe_now_sent_at is not None
    sent = set(queue.iterdir()) - before
    assert len(sent) == 1
    assert "gpu01" in next(iter(sent)).read_text()  # routed to the host's queue
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Asked gpu01 for a new snapshot; the tables refresh when it arrives."
    ]


def test_probe_now_explains_a_broker_failure_instead_of_failing(viewer_client):
    queue = filesystem_queue()
    store("gpu01")
    parked = queue.with_name("queue-parked")
    queue.rename(parked)
    queue.write_text("")  # a file where the folder should be: the broker cannot recreate it
    try:
        response = viewer_client.post(URL, follow=True)
    finally:
        queue.unlink()
        parked.rename(queue)
    assert response.status_code == 200
    page = response.content.decode()
    assert '<div class="message message-error" role="alert">Could not ask gpu01 for a probe:' in page


def test_probe_now_for_an_unknown_host_is_404(viewer_client):
    assert viewer_client.post(URL).status_code == 404


def test_a_second_press_within_the_interval_sends_nothing_and_says_when(viewer_client, requester_client):
    queue = filesystem_queue()
    store("gpu01")
    viewer_client.post(URL)
    before = set(queue.iterdir())
    response = requester_client.post(URL, follow=True)  # someone else, a moment later
    assert set(queue.iterdir()) == before
    page = response.content.decode()
    assert "gpu01 was asked for a probe less than" in page
    assert "its regular probes go on meanwhile" in page


def test_probe_now_on_an_offline_host_says_it_is_offline_not_that_all_is_well(viewer_client):
    queue = filesystem_queue()
    make_offline(store("gpu01"))
    before = set(queue.iterdir())
    response = viewer_client.post(URL, follow=True)
    assert len(set(queue.iterdir()) - before) == 1  # asked all the same: the agent may be back
    page = response.content.decode()
    warning = '<div class="message message-warning" role="status">gpu01 is offline (last seen 2 h ago)'
    assert warning in page
    assert "message-success" not in page
