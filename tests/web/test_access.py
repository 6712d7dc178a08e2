"""Every page needs a login, then the viewer role; the probe button needs POST."""

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.fleet.helpers import store_busy_host
from tests.people import client_for

pytestmark = pytest.mark.django_db

PAGES = [("fleet", {}), ("host_detail", {"name": "gpu01"})]


@pytest.fixture(autouse=True)
def _host() -> None:
    store_busy_host("gpu01")


@pytest.mark.parametrize(("name", "kwargs"), PAGES)
def test_anonymous_visitors_are_sent_to_the_login_page(name, kwargs):
    url = reverse(name, kwargs=kwargs)
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.parametrize(("name", "kwargs"), PAGES)
def test_an_account_without_a_role_is_refused(stranger, name, kwargs):
    assert client_for(stranger).get(reverse(name, kwargs=kwargs)).status_code == 403


@pytest.mark.parametrize(("name", "kwargs"), PAGES)
@pytest.mark.parametrize("person", ["viewer", "requester", "approver"])
def test_every_role_sees_the_pages(request, person, name, kwargs):
    user = request.getfixturevalue(person)
    assert client_for(user).get(reverse(name, kwargs=kwargs)).status_code == 200


def test_probe_now_needs_a_login_and_a_role(stranger):
    url = reverse("host_probe", kwargs={"name": "gpu01"})
    assert Client().post(url).status_code == 302
    assert client_for(stranger).post(url).status_code == 403


def test_probe_now_refuses_get(viewer_client):
    assert viewer_client.get(reverse("host_probe", kwargs={"name": "gpu01"})).status_code == 405


def test_login_page_renders_and_logs_in(viewer):
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert b'name="password"' in page.content
    response = client.post(reverse("login"), {"username": "vera", "password": "correct horse battery"})
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet")
    assert client.get(reverse("fleet")).status_code == 200


def test_the_page_shows_who_is_logged_in_and_logs_out_with_post(viewer_client):
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert '<span class="user-name">vera</span>' in page
    assert '<span class="user-roles">viewer</span>' in page
    assert f'<form method="post" action="{reverse("logout")}"' in page
    response = viewer_client.post(reverse("logout"))
    assert response.status_code == 302
    assert viewer_client.get(reverse("fleet")).status_code == 302


def test_the_nav_links_to_the_other_pages(viewer_client):
    page = viewer_client.get(reverse("fleet")).content.decode()
    assert f'<a href="{reverse("fleet")}">Fleet</a>' in page
    assert f'<a href="{reverse("kill_requests")}">Kill requests</a>' in page
    assert f'<a href="{reverse("audit_log")}">Audit</a>' in page


def test_pages_load_vendored_htmx_and_give_it_a_working_csrf_token(viewer):
    from django.contrib.staticfiles import finders

    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    page = client.get(reverse("fleet")).content.decode()
    assert '<script src="/static/vendor/htmx/htmx-2.0.11.min.js" defer></script>' in page
    assert '<link rel="stylesheet" href="/static/css/gpuadmin.css">' in page
    assert finders.find("vendor/htmx/htmx-2.0.11.min.js") and finders.find("css/gpuadmin.css")
    assert "://" not in page  # nothing from another origin: labs are often offline
    body = r"""<body hx-ext="morph" hx-headers='\{"X-CSRFToken": "([A-Za-z0-9]+)"\}'>"""
    token = re.search(body, page).group(1)
    # What htmx sends with its header is accepted where a missing one is refused.
    probe = reverse("host_probe", kwargs={"name": "gpu01"})
    assert client.post(probe).status_code == 403
    assert client.post(probe, HTTP_X_CSRFTOKEN=token).status_code == 302
