"""Anything from a process is untrusted: escaped, and its control characters shown, never obeyed."""

import json
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils.html import escape

from tests.fleet.helpers import HOSTILE_CMDLINE, HOSTILE_NAME, HOSTILE_USER, store_hostile_host

pytestmark = pytest.mark.django_db

CTL = '<span class="ctl" title="control character">'

RAW_DANGERS = ["<script>", "<img src=x", "<b>mallory", "<i>", "\x1b", "\u202e"]


@pytest.fixture
def hostile(db):
    return store_hostile_host("gpu66")


def get(client, url, **headers) -> str:
    response = client.get(url, **headers)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.parametrize("htmx", [False, True], ids=["full page", "htmx poll"])
def test_host_page_escapes_command_line_user_and_name(viewer_client, hostile, htmx):
    headers = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "host-tables"} if htmx else {}
    page = get(viewer_client, reverse("host_detail", kwargs={"name": "gpu66"}), **headers)
    for raw in RAW_DANGERS:
        assert raw not in page
    # Command line: markup escaped, ESC and U+202E shown as escapes, nothing dropped.
    # (One span per argument, a break opportunity only between them.)
    assert (
        '<span class="cmdline"><span class="arg">python</span> <wbr><span class="arg">&lt;script&gt;alert(1)'
        '&lt;/script&gt;</span> <wbr><span class="arg">&quot;&gt;&lt;img src=x onerror=alert(1)&gt;</span> '
        f'<wbr><span class="arg">{CTL}\\x1b</span>[31mred</span> '
        f'<wbr><span class="arg">evil{CTL}\\u202e</span>gpj.exe</span></span>'
    ) in page
    # User name (holders table and zombie tree) and process name (zombie tree and parent column).
    user = f"&lt;b&gt;mallory&lt;/b&gt;{CTL}\\u202e</span>"
    name = f"{CTL}\\x1b</span>[2Jx&lt;i&gt;"
    assert page.count(user) >= 2
    assert page.count(name) >= 2


def test_filter_choices_escape_user_names_in_attributes_and_text(viewer_client, hostile):
    page = get(viewer_client, reverse("host_detail", kwargs={"name": "gpu66"}))
    assert "\u202e" not in page
    shown = "&lt;b&gt;mallory&lt;/b&gt;\\u202e"
    assert f'<option value="{shown}">{shown}</option>' in page


def test_filtering_by_a_hostile_user_name_still_finds_the_process(viewer_client, hostile):
    # The filter takes the name as shown: control characters written as escapes.
    shown = "<b>mallory</b>\\u202e"
    url = reverse("host_detail", kwargs={"name": "gpu66"})
    page = get(viewer_client, f"{url}?{urlencode({'user': shown})}")
    assert ' data-pid="4242">' in page
    assert "\u202e" not in page


def test_findings_quoting_a_process_are_escaped_too(viewer_client, hostile):
    page = get(viewer_client, reverse("host_detail", kwargs={"name": "gpu66"}))
    zombie_finding = hostile.findings.get(kind="zombies")
    assert "<script>" in zombie_finding.title  # the finding quotes the parent's command line...
    assert f"<strong>{escape(zombie_finding.title)}</strong>" in page  # ...and the page escapes it
    for raw in RAW_DANGERS:
        assert raw not in page


def test_fleet_page_with_a_hostile_host_has_nothing_raw(viewer_client, hostile):
    page = get(viewer_client, reverse("fleet"))
    for raw in RAW_DANGERS:
        assert raw not in page


def test_api_returns_hostile_strings_as_json_strings(viewer_client, hostile):
    response = viewer_client.get(reverse("api_host_detail", kwargs={"name": "gpu66"}))
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    holder = body["processes"][0]
    assert holder["cmdline"] == HOSTILE_CMDLINE
    assert holder["user"] == HOSTILE_USER
    assert holder["name"] == HOSTILE_NAME
    assert body["zombie_trees"][0]["zombies"][0]["user"] == HOSTILE_USER
    # JSON carries the control characters escaped, never as raw bytes.
    assert b"\x1b" not in response.content
    assert "\u202e".encode() not in response.content
