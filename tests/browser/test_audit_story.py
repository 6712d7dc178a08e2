"""A reviewer reads a finished kill's story on the audit page, in a real browser: the sentences,
the raw event behind one, the times in their own time zone, then the same kill as one story."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from django.utils import timezone as django_timezone
from playwright.sync_api import expect

from gpuadmin.audit.models import Action, AuditEvent
from tests.kills.helpers import REASON, STORY_PID, finished_kill

# The live server reads in its own thread what the test wrote: committed data. serialized_rollback
# puts back the roles (groups) a migration made, which the flush at the end removes.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)



def test_a_finished_kill_reads_as_a_story(open_page, screenshot, requester, approver, viewer):
    story = finished_kill(requester, approver)
    number = story.kill_request.pk
    approved = AuditEvent.objects.get(kill_request_id=number, action=Action.APPROVED)
    page = open_page(viewer, timezone_id="Asia/Kolkata")
    page.goto("/audit/")

    # The events, newest first, each one sentence.
    sentences = page.locator("#audit-results tr.audit-event td.sentence")
    expect(sentences).to_have_count(8)
    row = page.locator(f"#audit-event-{approved.sequence}")
    expect(row).to_contain_text(f"april approved #{number} (requested by rick: {REASON})")
    results = page.locator("#audit-results")
    expect(results).to_contain_text(f"gpu01 sent SIGINT to PID {STORY_PID} python (alice)")
    expect(page.locator("#audit-results")).to_contain_text(f"#{number} succeeded: 1 of 1 target gone")
    expect(page.locator("#audit-results")).to_contain_text("10 GiB of GPU memory back on gpu01")
    expect(page.locator(".audit-verify-ok")).to_contain_text("Chain verifies")

    # Times in the lab's zone whatever the viewer's browser says (India, +05:30 here), the age beside,
    # the full time on hover: the same moment reads the same to everyone in the lab.
    stamp = row.locator("td.when time")
    lab = django_timezone.localtime(approved.created_at)
    expect(stamp).to_contain_text(lab.strftime("%H:%M"))
    expect(stamp).to_have_text(re.compile(r"\((just now|\d+ (s|min|h|d) ago)\)$"))
    assert stamp.get_attribute("title") == f"{lab:%Y-%m-%d %H:%M:%S} {lab.tzname()}"

    # The raw event, one click away: every hashed field, the hash, whether it recomputes.
    raw = row.locator("details.raw-event")
    expect(raw.locator("dl")).to_be_hidden()
    raw.locator("summary").click()
    expect(raw.locator("dl")).to_be_visible()
    expect(raw).to_contain_text(approved.hash)
    expect(raw).to_contain_text(approved.previous_hash)
    expect(raw).to_contain_text("The hash recomputes from these fields.")
    screenshot(page, "events")

    # The same kill as one story, through htmx: the URL follows, times as on the events page.
    page.get_by_role("link", name="By request").click()
    block = page.locator(f"#story-{number}")
    expect(block).to_be_visible()
    assert page.url.endswith("/audit/?view=requests")
    expect(block.locator(".kill-status")).to_have_text("Succeeded")
    expect(block).to_contain_text(REASON)
    expect(block).to_contain_text("10 GiB of 10 GiB held")
    expect(block.locator("li.audit-event")).to_have_count(8)
    first = datetime.fromisoformat(block.locator("time").first.get_attribute("datetime"))
    expect(block.locator("time.moment").first).to_contain_text(
        django_timezone.localtime(first).strftime("%H:%M"))
    screenshot(page, "by-request")

    # A filter keeps the view: nothing was rejected.
    page.select_option("#id_action", "rejected")
    expect(page.locator("#audit-results")).to_contain_text("No kill requests match.")
    assert "view=requests" in page.url and "action=rejected" in page.url
