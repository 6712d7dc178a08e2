"""Helpers of the account tests."""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.urls import reverse

from gpuadmin.accounts import sudo
from gpuadmin.audit.models import AuditEvent
from tests.people import PASSWORD

# Past the re-authentication window (GPUADMIN_REAUTH_MAX_AGE_SECONDS, 15 minutes).
SIXTEEN_MINUTES = 16 * 60


def account_events() -> list[tuple[str, str, dict[str, Any]]]:
    """(action, actor name, details) of every audit event, oldest first."""
    return [(e.action, e.actor_name, e.details) for e in AuditEvent.objects.order_by("sequence")]


def logged_in(username: str, password: str = PASSWORD) -> Client:
    """A client that logged in through the login page (so its session counts for approving)."""
    client = Client()
    response = client.post(reverse("login"), {"username": username, "password": password})
    assert response.status_code == 302, f"{username} could not log in"
    return client


def age_the_login(client: Client, seconds: float) -> None:
    session = client.session
    session[sudo.SESSION_KEY]["at"] -= seconds
    session.save()
