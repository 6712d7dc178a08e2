"""Helpers of the notification tests: a webhook receiver, people behind the lab's users."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.contrib.auth.models import User

from gpuadmin.notify.models import Account, Person

REASON = "the job ran over its reservation"


class Inbox(ThreadingHTTPServer):
    """A webhook receiver on a free loopback port: POSTs to /ok are kept, /fail answers 500,
    /redirect sends the client on to /ok (307). ``connections`` counts every connection made."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[dict[str, Any]] = []
        self.failed_attempts = 0
        self.connections = 0

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.connections += 1
        return True

    def url(self, path: str = "ok") -> str:
        return f"json://127.0.0.1:{self.server_port}/{path}"


class _Handler(BaseHTTPRequestHandler):
    server: Inbox

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/fail"):
            self.server.failed_attempts += 1
            self.send_response(500)
        elif self.path.startswith("/redirect"):
            self.send_response(307)
            self.send_header("Location", "/ok")
        else:
            self.server.received.append(json.loads(body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet test output
        pass


def person(name: str, email: str = "", *, user: User | None = None, urls: str = "",
           unix: str | None = None, **choices: bool) -> Person:
    found = Person.objects.create(name=name, email=email, user=user, notification_urls=urls, **choices)
    if unix:
        Account.objects.create(person=found, name=unix)
    return found
