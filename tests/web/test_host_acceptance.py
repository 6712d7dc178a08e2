"""Approvers see hosts awaiting acceptance and accept them on the host page; nobody else sees them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from gpuadmin.accounts import sudo
from gpuadmin.audit.models import AuditEvent
from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.models import Host
from gpuadmin.wire.signing import fingerprint
from tests.accounts.helpers import SIXTEEN_MINUTES, age_the_login, logged_in
from tests.factories import snapshot
from tests.keys import host_key, signed_snapshot
from tests.people import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def offered() -> Host:
    receive_snapshot(signed_snapshot(snapshot("newbox")))
    return Host.objects.get(name="newbox")


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_approvers_see_the_awaiting_host_and_its_fingerprint_viewers_do_not(offered, approver, viewer):
    page = client_for(approver).get("/").content.decode()
    assert "Hosts awaiting acceptance" in page and offered.key_fingerprint in page
    assert "newbox" not in client_for(viewer).get("/").content.decode()
    assert client_for(viewer).get("/hosts/newbox/").status_code == 404
    host_page = client_for(approver).get("/hosts/newbox/").content.decode()
    assert "awaiting acceptance" in host_page and offered.key_fingerprint in host_page


def test_an_approver_accepts_the_key_shown(offered, approver):
    response = client_for(approver).post("/hosts/newbox/accept/", {"fingerprint": offered.key_fingerprint})
    assert response.status_code == 302
    assert Host.objects.get(name="newbox").key_accepted
    assert AuditEvent.objects.get(action="host_accepted").actor_name == approver.username


def test_a_key_that_changed_since_the_page_was_shown_is_not_accepted(offered, approver):
    client_for(approver).post("/hosts/newbox/accept/", {"fingerprint": fingerprint(host_key("other"))})
    assert not Host.objects.get(name="newbox").key_accepted


def test_only_approvers_accept(offered, viewer, requester):
    for user in (viewer, requester):
        response = client_for(user).post("/hosts/newbox/accept/", {"fingerprint": offered.key_fingerprint})
        assert response.status_code == 403
    assert not Host.objects.get(name="newbox").key_accepted


def test_a_stale_session_accepts_nothing_and_is_sent_to_reauthenticate(offered, approver):
    """Accepting a key needs the same recent re-authentication as approving a kill."""
    client = logged_in("april")
    age_the_login(client, SIXTEEN_MINUTES)
    response = client.post("/hosts/newbox/accept/", {"fingerprint": offered.key_fingerprint})
    assert response["Location"] == sudo.reauth_url("/hosts/newbox/")
    assert not Host.objects.get(name="newbox").key_accepted
    client.post(reverse("reauthenticate"), {"password": PASSWORD, "next": "/hosts/newbox/"})
    client.post("/hosts/newbox/accept/", {"fingerprint": offered.key_fingerprint})
    assert Host.objects.get(name="newbox").key_accepted


def test_an_approver_clears_one_offer_or_all_of_them_from_the_panel(offered, approver):
    for name in ("made-up-1", "made-up-2"):
        receive_snapshot(signed_snapshot(snapshot(name)))
    client = client_for(approver)
    assert "Clear all 3 offers" in client.get("/").content.decode()
    assert "Clear this offer" in client.get("/hosts/made-up-1/").content.decode()

    client.post("/hosts-awaiting/clear/", {"name": "made-up-1"})
    awaiting = Host.objects.awaiting_acceptance().values_list("name", flat=True)
    assert sorted(awaiting) == ["made-up-2", "newbox"]
    client.post("/hosts-awaiting/clear/")
    assert not Host.objects.exists()  # offers only: no snapshot of theirs was ever stored
    cleared = AuditEvent.objects.filter(action="host_key_forgotten").order_by("sequence")
    assert [(e.host_name, e.actor_name) for e in cleared] == [
        ("made-up-1", approver.username), ("made-up-2", approver.username), ("newbox", approver.username)]


def test_only_approvers_clear_offers(offered, viewer, requester):
    for user in (viewer, requester):
        assert client_for(user).post("/hosts-awaiting/clear/").status_code == 403
    assert client_for(viewer).get("/hosts-awaiting/clear/").status_code in (403, 405)
    assert Host.objects.get(name="newbox").awaiting_acceptance
