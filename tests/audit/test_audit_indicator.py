"""The audit page's "updating…" indicator shows only while a filter or page request runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db

STYLESHEET = Path(settings.BASE_DIR) / "static" / "css" / "gpuadmin.css"


def _classes_of(html: str, element_id: str) -> set[str]:
    match = re.search(rf'<[a-z]+\b[^>]*\bid="{element_id}"[^>]*>', html)
    assert match, f"no element #{element_id}"
    classes = re.search(r'\bclass="([^"]*)"', match.group(0))
    return set(classes.group(1).split()) if classes else set()


def test_the_updating_indicator_is_hidden_until_htmx_marks_a_request(viewer_client: Client):
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert 'hx-indicator="#audit-refreshing"' in html
    # htmx adds "htmx-request" to the indicator while the request runs; the stylesheet hides an
    # .htmx-indicator otherwise. Without the class the text shows all the time.
    assert "htmx-indicator" in _classes_of(html, "audit-refreshing")
    css = STYLESHEET.read_text()
    hidden = re.search(r"(^|[\s,}])\.htmx-indicator\s*\{[^}]*\bopacity:\s*0\b", css)
    shown = re.search(r"\.htmx-request\.htmx-indicator[^{]*\{[^}]*\bopacity:\s*1\b", css)
    assert hidden and shown, "gpuadmin.css must hide .htmx-indicator except during a request"
