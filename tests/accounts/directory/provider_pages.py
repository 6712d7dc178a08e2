"""Going through the test provider's pages without a browser: Django's test client for the panel,
a requests session (the provider's cookies: its own session) for the provider."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests
from django.test import Client

LOGIN_FORM_MARK = 'id="sign-in"'


@dataclass
class Person:
    """One browser: the panel's session and the provider's."""

    client: Client = field(default_factory=Client)
    provider: requests.Session = field(default_factory=requests.Session)
    provider_asked: int = 0  # how many times the provider showed its login page

    def go(self, path: str, username: str, password: str) -> object:
        """GET ``path`` on the panel and follow it through the provider (signing in when asked) back to
        the panel's callback; returns the callback's response."""
        response = self.client.get(path)
        assert response.status_code == 302, response
        return self.go_on(response["Location"], username, password)

    def go_on(self, url: str, username: str, password: str) -> object:
        """Follow ``url`` (the provider's, say) as ``go`` does."""
        for _ in range(20):
            if url.startswith("http://testserver/"):
                parts = urlsplit(url)
                return self.client.get(f"{parts.path}?{parts.query}")
            answer = self.provider.get(url, allow_redirects=False, timeout=10)
            if answer.status_code == 200 and LOGIN_FORM_MARK in answer.text:
                self.provider_asked += 1
                answer = self.provider.post(url, data={"login": username, "password": password},
                                            allow_redirects=False, timeout=10)
            assert answer.status_code in (302, 303), (answer.status_code, answer.text[:500])
            url = requests.compat.urljoin(url, answer.headers["Location"])
        raise AssertionError("too many redirects")
