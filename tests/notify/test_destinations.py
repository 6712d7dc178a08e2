"""Notification URLs reach public servers only, unless an admin allows others (issue 30).

A requester saved json://127.0.0.1:9911/internal/admin and central sent requests there, showing
the answer's status. A real HTTP server on loopback (the Inbox) stands for that local service: a
refused URL must not even connect to it, at save time or at send time.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from gpuadmin.notify.delivery import DELIVERY_FAILED, _non_public, destination_problem, send
from gpuadmin.notify.models import Person

pytestmark = pytest.mark.django_db


@pytest.fixture
def public_only(settings):
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = False
    return settings


def loopback_forms(port: int) -> list[str]:
    """The Inbox's address written every way a resolver reads as loopback."""
    return [f"json://127.0.0.1:{port}/ok", f"json://localhost:{port}/ok", f"jsons://2130706433:{port}/ok",
            f"xml://0x7f000001:{port}/ok", f"form://127.0.0.2:{port}/ok", f"json://[::1]:{port}/ok",
            f"json://user:pw@127.0.0.1:{port}/ok?redirect=yes"]


def test_a_loopback_url_is_refused_at_send_and_the_server_gets_no_connection(public_only, inbox):
    for url in loopback_forms(inbox.server_port):
        outcome = send(url, "t", "b")
        assert not outcome.ok, url
        assert outcome.error.startswith("refused: "), outcome.error
        assert "loopback address" in outcome.error, outcome.error
    assert inbox.connections == 0
    assert inbox.received == []


@pytest.mark.parametrize("url", [
    "windows://", "macosx://", "dbus://", "glib://", "kde://", "syslog://", "file:///etc/passwd",
    "mailto://user:pw@lab.example?smtp=127.0.0.1", "nosuchservice://x", "no scheme at all",
])
def test_schemes_that_reach_this_box_or_name_no_server_are_refused(public_only, url):
    assert "is not a scheme gpuadmin sends to" in destination_problem(url)
    assert not send(url, "t", "b").ok


@pytest.mark.parametrize(("address", "kind"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"), ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("10.1.2.3", "private"), ("192.168.1.1", "private"), ("fd00::1", "private"),
    ("240.0.0.1", "reserved"), ("100.64.0.1", "non-public"),
    ("93.184.215.14", ""), ("2606:4700::1111", ""),
])
def test_addresses_by_kind(address, kind):
    assert _non_public(address) == kind


def test_a_public_address_and_the_public_services_are_allowed(public_only):
    assert destination_problem("json://93.184.215.14/hook") == ""
    assert destination_problem("slack://T1/B1/C1") == ""  # always Slack's own servers
    assert destination_problem("djangomail://alice@lab.example") == ""  # the admin's SMTP server


def test_an_admin_can_allow_the_lab_s_own_addresses(settings, inbox):
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = True
    assert send(inbox.url("ok"), "t", "b").ok
    assert len(inbox.received) == 1
    assert "is not a scheme" in destination_problem("syslog://")  # schemes stay refused


def test_a_url_saved_while_allowed_is_checked_again_when_sent(settings, viewer, viewer_client, inbox):
    """The address is checked at every send, as a name's answer may change after it was saved."""
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = True
    response = viewer_client.post(reverse("notification_preferences"),
                                  {"email": "", "notification_urls": inbox.url("ok")})
    assert response.status_code == 302
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = False
    (url,) = Person.objects.get(user=viewer).apprise_urls()
    assert not send(url, "t", "b").ok
    assert inbox.connections == 0


def test_redirects_are_not_followed(settings, inbox):
    """A server central may reach must not send it on to one it may not."""
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = True
    outcome = send(inbox.url("redirect") + "?redirect=yes", "t", "b")
    assert (outcome.ok, outcome.error) == (False, DELIVERY_FAILED)
    assert inbox.received == []


def test_the_preferences_page_refuses_a_local_url_and_saves_nothing(public_only, viewer, viewer_client,
                                                                     inbox):
    url = f"json://127.0.0.1:{inbox.server_port}/internal/admin"
    response = viewer_client.post(reverse("notification_preferences"),
                                  {"email": "", "notification_urls": url})
    assert response.status_code == 400
    page = response.content.decode()
    assert "127.0.0.1, a loopback address: notifications go to public servers only" in page
    assert not Person.objects.filter(user=viewer).exists()
    assert inbox.connections == 0
