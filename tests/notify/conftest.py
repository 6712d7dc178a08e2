"""Fixtures for notifications: the kills lab host, people behind its users, a real local HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.notify.models import Account, Person
from tests.kills.conftest import _lab_protections, store_snapshot  # noqa: F401 - autouse fixture
from tests.kills.lab import lab_snapshot
from tests.people import _fast_password_hashing  # noqa: F401 - autouse fixture

REASON = "the job ran over its reservation"


@pytest.fixture(autouse=True)
def _mail_in_memory(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.GPUADMIN_BASE_URL = "https://gpuadmin.lab.example"


@pytest.fixture
def lab(db: None) -> Host:
    return store_snapshot(lab_snapshot(taken_at=timezone.now() - timedelta(seconds=60)))


class Inbox(ThreadingHTTPServer):
    """A webhook receiver on a free loopback port: POSTs to /ok are kept, /fail answers 500."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[dict[str, Any]] = []
        self.failed_attempts = 0

    def url(self, path: str = "ok") -> str:
        return f"json://127.0.0.1:{self.server_port}/{path}"


class _Handler(BaseHTTPRequestHandler):
    server: Inbox

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/fail"):
            self.server.failed_attempts += 1
            self.send_response(500)
        else:
            self.server.received.append(json.loads(body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet test output
        pass


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    server = Inbox()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def person(name: str, email: str = "", *, user: User | None = None, urls: str = "",
           unix: str | None = None, **choices: bool) -> Person:
    found = Person.objects.create(name=name, email=email, user=user, notification_urls=urls, **choices)
    if unix:
        Account.objects.create(person=found, name=unix)
    return found
