"""The hosts API takes a token or a session, and needs the viewer role."""

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from knox.models import AuthToken

from tests.fleet.helpers import store_busy_host
from tests.people import client_for

pytestmark = pytest.mark.django_db

ENDPOINTS = [("api_hosts", {}), ("api_host_detail", {"name": "gpu01"})]


@pytest.fixture(autouse=True)
def _host() -> None:
    store_busy_host("gpu01")


def token_of(username: str, capsys) -> str:
    call_command("api_token", username)
    return capsys.readouterr().out.strip()


@pytest.mark.parametrize(("name", "kwargs"), ENDPOINTS)
def test_no_credentials_answer_401_json(name, kwargs):
    response = Client().get(reverse(name, kwargs=kwargs))
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response["WWW-Authenticate"] == "Token"
    assert response.json() == {"detail": "Authentication credentials were not provided."}


@pytest.mark.parametrize(("name", "kwargs"), ENDPOINTS)
def test_a_token_from_the_api_token_command_works(viewer, capsys, name, kwargs):
    key = token_of("vera", capsys)
    assert AuthToken.objects.filter(user=viewer).count() == 1
    response = Client().get(reverse(name, kwargs=kwargs), HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 200


def test_a_wrong_token_answers_401(viewer):
    response = Client().get(reverse("api_hosts"), HTTP_AUTHORIZATION="Token not-a-real-token")
    assert response.status_code == 401
    assert response.json() == {"detail": "Invalid token."}


@pytest.mark.parametrize(("name", "kwargs"), ENDPOINTS)
def test_a_token_of_an_account_without_a_role_answers_403(stranger, capsys, name, kwargs):
    key = token_of("sam", capsys)
    response = Client().get(reverse(name, kwargs=kwargs), HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 403
    assert response.json() == {"detail": "This needs the viewer role."}


@pytest.mark.parametrize(("name", "kwargs"), ENDPOINTS)
def test_a_logged_in_session_works(viewer_client, name, kwargs):
    response = viewer_client.get(reverse(name, kwargs=kwargs))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"


def test_a_session_without_a_role_answers_403(stranger):
    assert client_for(stranger).get(reverse("api_hosts")).status_code == 403


def test_the_api_is_read_only(viewer):
    _, key = AuthToken.objects.create(user=viewer)
    response = Client().post(reverse("api_hosts"), {}, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 405
