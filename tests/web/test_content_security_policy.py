"""The Content-Security-Policy (settings.CONTENT_SECURITY_POLICY) and the templates that live under it.

The browser side (nothing runs, no violation reported) is tests/browser/.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import pytest
from django.urls import reverse

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "templates").rglob("*.html"))


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in header.split(";")) if d}


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/login/", "/", "/kills/", "/audit/"])
def test_every_page_has_a_policy_with_no_inline_script_no_eval_no_inline_style(viewer_client, url):
    directives = policy(viewer_client.get(url))
    assert directives["default-src"] == ["'self'"]
    assert directives["script-src"] == ["'self'"]
    assert directives["style-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"]
    assert directives["frame-ancestors"] == ["'none'"]
    everything = " ".join(" ".join(values) for values in directives.values())
    assert "unsafe-inline" not in everything and "unsafe-eval" not in everything


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(REPO / "templates")))
def test_no_template_has_inline_script_event_handlers_or_style(template: Path):
    text = template.read_text()
    for tag in re.findall(r"<script\b[^>]*>", text):
        assert re.search(r"\bsrc=", tag), f"inline script: {tag}"
    assert not re.search(r"\s(on[a-z]+|hx-on[:\w-]*|style)\s*=", text), "event handler or style attribute"
    assert "<style" not in text
    assert "javascript:" not in text.lower()


@pytest.mark.django_db
def test_htmx_is_configured_for_the_policy(viewer_client):
    page = viewer_client.get(reverse("fleet")).content.decode()
    content = re.search(r"""<meta name="htmx-config" content='([^']*)'>""", page).group(1)
    config = json.loads(unescape(content))
    assert config == {"includeIndicatorStyles": False, "allowEval": False, "allowScriptTags": False,
                      "selfRequestsOnly": True}
