"""Fixtures for notifications: the kills lab host, mail kept in memory, a real local HTTP server,
and real workers over Redis (tests/integration/helpers.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.helpers import publish_to, start_worker  # noqa: F401 - fixtures
from tests.kills.helpers import lab, protect_like_the_lab  # noqa: F401 - lab: fixture
from tests.notify.helpers import Inbox


@pytest.fixture(autouse=True)
def _lab_protections(settings: Any) -> None:
    protect_like_the_lab(settings)


@pytest.fixture(autouse=True)
def _mail_in_memory(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.GPUADMIN_BASE_URL = "https://gpuadmin.lab.example"


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    """The tests' webhook receiver (Inbox) listens on loopback: an admin's choice to allow it.
    tests/notify/test_delivery.py turns it off to see such URLs refused."""
    settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE = True


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    server = Inbox()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
