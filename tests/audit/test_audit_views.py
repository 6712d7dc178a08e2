"""The audit page's two views (events, by request), the raw event one click away, times as <time>,
the sentence in the CSV and the API, and the icon every page asks for."""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpuadmin.audit import log
from gpuadmin.audit.chain import HASHED_FIELDS
from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.text import utc_text
from tests.audit.helpers import audit_table, tamper
from tests.kills.helpers import REASON, finished_kill

pytestmark = pytest.mark.django_db

STORY = re.compile(r'<article class="story card" id="story-(\d+)"')
ROW = re.compile(r'id="audit-event-(\d+)"')


def stories(response) -> list[int]:
    return [int(n) for n in STORY.findall(response.content.decode())]


def file_requests(count: int, *, host: str = "gpu1") -> None:
    """``count`` requests with two events each, as log.record writes them."""
    for number in range(1, count + 1):
        for action in (Action.REQUESTED, Action.REJECTED):
            log.record(action, kill_request_id=number, host_name=host, requester_name="alice",
                       details={"reason": f"reason {number}"})


# --- by request ---------------------------------------------------------------------------------


def test_the_grouped_view_tells_a_finished_kill_as_one_story(viewer_client: Client, requester, approver):
    story = finished_kill(requester, approver)
    number = story.kill_request.pk
    response = viewer_client.get(reverse("audit_log"), {"view": "requests"})
    html = response.content.decode()

    assert stories(response) == [number]
    block = html[html.index(f'id="story-{number}"'):]
    assert 'kill-status-succeeded">Succeeded</span>' in block
    assert f'<dt>Reason</dt><dd class="reason"><q class="said">{REASON}</q></dd>' in block
    assert "<dt>Requested by</dt><dd>rick, <time" in block
    assert "<dt>Approved by</dt><dd>april</dd>" in block
    assert "from request to end; 0.75 s on the host" in block
    assert "<dt>Memory freed</dt><dd>10 GiB of 10 GiB held</dd>" in block
    # Its events inside, oldest first, each with its sentence.
    sequences = AuditEvent.objects.filter(kill_request_id=number).order_by("sequence")
    assert [int(n) for n in ROW.findall(block)] == list(sequences.values_list("sequence", flat=True))
    assert "exited after <code>SIGINT</code>" in block


def test_the_grouped_view_filters_and_pages_by_request(viewer_client: Client):
    file_requests(25)
    log.record(Action.REQUESTED, kill_request_id=99, host_name="gpu2", requester_name="bob")
    url = reverse("audit_log")

    first = viewer_client.get(url, {"view": "requests"})
    assert stories(first) == [99, *range(25, 6, -1)]
    assert "page 1 of 2" in first.content.decode()
    second = viewer_client.get(url, {"view": "requests", "page": 2}, headers={"HX-Request": "true"})
    assert stories(second) == list(range(6, 0, -1))
    assert "<html" not in second.content.decode()
    # A filter picks requests; the page links keep it and the view.
    only_gpu2 = viewer_client.get(url, {"view": "requests", "host": "gpu2"}, headers={"HX-Request": "true"})
    assert stories(only_gpu2) == [99]
    by_action = viewer_client.get(url, {"view": "requests", "host": "gpu1"}).content.decode()
    assert 'href="?view=requests&amp;host=gpu1&amp;page=2"' in by_action


def test_a_request_shows_its_whole_story_even_when_a_filter_matches_one_event(viewer_client: Client):
    file_requests(1)
    response = viewer_client.get(reverse("audit_log"), {"view": "requests", "action": "rejected"})
    assert stories(response) == [1]
    assert ROW.findall(response.content.decode()) == ["1", "2"]


def test_events_about_no_request_are_a_story_of_their_own(viewer_client: Client):
    log.record(Action.EXPIRED, host_name="gpu1", details={"why": "no request number"})
    html = viewer_client.get(reverse("audit_log"), {"view": "requests"}).content.decode()
    assert "Events about no kill request" in html and 'id="audit-event-1"' in html


def test_the_view_switch_keeps_the_filters_and_rides_with_the_form(viewer_client: Client):
    file_requests(1)
    html = viewer_client.get(reverse("audit_log"), {"host": "gpu1"}).content.decode()
    assert 'href="/audit/?host=gpu1&amp;view=requests"' in html
    assert '<a href="/audit/?host=gpu1" hx-get="/audit/?host=gpu1" aria-current="page">Events</a>' in html
    # The filter form sends the view: the hidden input is in the results, tied to the form by id.
    assert 'id="audit-filters"' in html
    assert '<input type="hidden" name="view" value="events" form="audit-filters">' in html
    grouped = viewer_client.get(reverse("audit_log"), {"view": "requests"},
                                headers={"HX-Request": "true"}).content.decode()
    assert '<input type="hidden" name="view" value="requests" form="audit-filters">' in grouped
    assert grouped.lstrip().startswith('<div id="audit-results"')


# --- events: sentences, raw fields, times ----------------------------------------------------------


def test_each_row_reads_as_a_sentence_with_its_raw_event_one_click_away(viewer_client: Client, requester,
                                                                           approver):
    story = finished_kill(requester, approver)
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert '"at": "' not in html and "{&quot;at&quot;" not in html.split("<details")[0]
    approved = AuditEvent.objects.get(kill_request_id=story.kill_request.pk, action=Action.APPROVED)
    row = html[html.index(f'id="audit-event-{approved.sequence}"'):]
    row = row[: row.index("</tr>")]
    assert "april approved" in row and f"<q class=\"said\">{REASON}</q>" in row
    raw = row[row.index('<details class="raw-event">'):]
    for name in HASHED_FIELDS:
        assert f"<dt>{name}</dt>" in raw
    assert f"<dd class=\"mono\">{approved.hash}</dd>" in raw
    assert "The hash recomputes from these fields." in raw


def test_times_are_moments_in_the_labs_zone_with_their_age(viewer_client: Client):
    event = log.record(Action.REQUESTED, kill_request_id=1)
    html = viewer_client.get(reverse("audit_log")).content.decode()
    local = timezone.localtime(event.created_at)
    assert (f'<time class="moment" datetime="{utc_text(event.created_at)}" '
            f'title="{local:%Y-%m-%d %H:%M:%S} {local.tzname()}">{local:%H:%M} '
            '<span class="age">(just now)</span></time>') in html
    assert '<script src="/static/js/ages.js" defer></script>' in html
    assert "<script>" not in html  # no inline script: a strict CSP must hold


def test_the_raw_event_page_shows_every_hashed_field_and_its_links(viewer_client: Client, record_events):
    record_events(3)
    html = viewer_client.get(reverse("audit_event", args=[2])).content.decode()
    for name in HASHED_FIELDS:
        assert f"<dt>{name}</dt>" in html
    assert "The hash recomputes from these fields." in html
    assert "Its previous_hash is the hash of event #1." in html
    assert 'href="/audit/events/1/"' in html and 'href="/audit/events/3/"' in html
    assert viewer_client.get(reverse("audit_event", args=[9])).status_code == 404


def test_the_raw_event_page_says_when_an_event_was_changed(viewer_client: Client, record_events):
    record_events(3)
    tamper(f"UPDATE {audit_table()} SET host_name = 'elsewhere' WHERE sequence = 2")
    html = viewer_client.get(reverse("audit_event", args=[2])).content.decode()
    assert "The hash does NOT recompute from these fields" in html
    page = viewer_client.get(reverse("audit_log")).content.decode()
    assert "Chain BROKEN at event 2" in page


@pytest.mark.parametrize("name", ["audit_event"])
def test_the_raw_event_page_needs_the_viewer_role(client: Client, stranger, record_events, name: str):
    record_events(1)
    url = reverse(name, args=[1])
    assert client.get(url).status_code == 302
    client.force_login(stranger)
    assert client.get(url).status_code == 403


# --- CSV and API ---------------------------------------------------------------------------------


def test_the_csv_has_the_sentence_last_and_keeps_it_from_running_as_a_formula(viewer_client: Client,
                                                                             make_user):
    log.record(Action.REJECTED, actor=make_user("=cmd|' /C calc'!A0"), kill_request_id=3,
               requester_name="rick", details={"reason": "no"})
    body = b"".join(viewer_client.get(reverse("audit_export_csv")).streaming_content).decode()
    header, row = list(csv.reader(io.StringIO(body)))
    assert header[-1] == "sentence" and header[:3] == ["sequence", "created_at", "action"]
    assert row[-1] == "'=cmd|' /C calc'!A0 rejected #3 (requested by rick): “no”"


def test_the_api_adds_the_sentence_with_control_characters_escaped(viewer_client: Client):
    log.record(Action.SIGNAL_SENT, host_name="gpu01", kill_request_id=4,
               details={"pid": 9, "signal": "SIGINT", "name": "py\u202ethon"})
    result = viewer_client.get("/api/v1/audit/").json()["results"][0]
    assert result["details"]["name"] == "py\u202ethon"  # the raw field, as stored
    assert result["sentence"] == "gpu01 sent SIGINT to PID 9 py\\u202ethon"


# --- the icon ----------------------------------------------------------------------------------


def test_every_page_names_an_icon_and_favicon_ico_leads_to_it(client: Client, viewer_client: Client):
    html = viewer_client.get(reverse("audit_log")).content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    response = client.get("/favicon.ico")  # no login needed
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"
    icon = client.get("/static/favicon.svg")
    assert icon.status_code == 200
    assert b"<svg" in b"".join(icon.streaming_content)


def test_a_kill_request_page_links_to_its_story(requester, approver, viewer_client: Client):
    story = finished_kill(requester, approver)
    number = story.kill_request.pk
    html = viewer_client.get(reverse("kill_request_detail", args=[number])).content.decode()
    link = f"/audit/?view=requests&amp;kill_request={number}"
    assert f'href="{link}"' in html
    assert stories(viewer_client.get(link.replace("&amp;", "&"))) == [number]


@pytest.mark.parametrize("view", ["events", "requests"])
def test_sentences_do_not_cost_a_query_per_event(viewer_client: Client, django_assert_max_num_queries,
                                                   view: str):
    file_requests(30)  # 60 events, 30 requests: more than a page of either view; 6-7 queries today
    with django_assert_max_num_queries(8):
        response = viewer_client.get(reverse("audit_log"), {"view": view}, headers={"HX-Request": "true"})
    assert response.status_code == 200
