"""The kill request pages: list with inline decisions, the request page and its
live timeline, the new-request form with its preview. Process text is escaped."""

from __future__ import annotations

import pytest

from gpuadmin.accounts.roles import Role
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from tests.factories import proc
from tests.kills.helpers import file, lab_snapshot, refreshed, store_snapshot
from tests.people import client_for, make_person

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_the_list_shows_pending_first(lab, requester, approver, viewer):
    rejected = file(requester, 4300)
    services.reject(rejected.pk, approver, "no")
    pending = file(requester, 4600)
    page = client_for(viewer).get("/kills/").content.decode()
    assert page.index(f"kill-request-{pending.pk}") < page.index(f"kill-request-{rejected.pk}")
    assert "Pending approval" in page


def test_an_approver_approves_inline_and_gets_the_lists_back_with_the_row_moved(
    lab, requester, approver, sent, django_capture_on_commit_callbacks
):
    kill_request = file(requester, 4600)
    client = client_for(approver)
    assert f'hx-post="/kills/{kill_request.pk}/approve/"' in client.get("/kills/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/kills/{kill_request.pk}/approve/", **HTMX)
    assert response.status_code == 200
    lists = response.content.decode()
    assert lists.lstrip().startswith('<div id="kill-request-lists"')
    # The row is under "Approved and running" now, and "Pending approval" is empty.
    assert lists.index('id="kill-requests-active"') < lists.index(f'<tr id="kill-request-{kill_request.pk}"')
    assert 'id="kill-requests-pending-empty"' in lists
    assert "Approved" in lists and "Approve</button>" not in lists
    # Announced out of band, into the live regions above the polled lists; the error region emptied.
    announced = (f'class="decision-status" hx-swap-oob="morph"><p class="notice">'
                 f'Request #{kill_request.pk} approved.')
    assert announced in lists
    assert lists.index('id="kill-request-lists"') < lists.index(announced)
    assert 'role="alert" hx-swap-oob="morph"></div>' in lists
    assert refreshed(kill_request).status == Status.APPROVED


def test_the_lists_poll_for_their_sections_alone(lab, requester, viewer):
    kill_request = file(requester, 4600)
    client = client_for(viewer)
    page = client.get("/kills/").content.decode()
    assert 'hx-get="/kills/" hx-trigger="every 10s"' in page
    fragment = client.get("/kills/", **HTMX)
    assert fragment.content.decode().lstrip().startswith('<div id="kill-request-lists"')
    assert f'id="kill-request-{kill_request.pk}"' in fragment.content.decode()
    assert "<html" not in fragment.content.decode()
    assert "HX-Request" in fragment["Vary"]
    # The announcements live outside what the poll replaces, and the poll leaves them alone.
    assert page.index('id="kill-request-decision"') < page.index('id="kill-request-lists"')
    assert "kill-request-decision" not in fragment.content.decode()


def test_a_second_inline_approval_shows_already_approved_in_the_row(
    lab, requester, approver, second_approver, sent
):
    kill_request = file(requester, 4600)
    client_for(approver).post(f"/kills/{kill_request.pk}/approve/", **HTMX)
    row = client_for(second_approver).post(f"/kills/{kill_request.pk}/approve/", **HTMX).content.decode()
    assert "already approved (by april" in row


def test_a_rejection_without_reason_is_refused_in_the_row(lab, requester, approver):
    kill_request = file(requester, 4600)
    row = client_for(approver).post(f"/kills/{kill_request.pk}/reject/", {"reason": ""}, **HTMX)
    assert "needs a reason" in row.content.decode()
    assert refreshed(kill_request).status == Status.PENDING


def test_the_requester_sees_no_approve_button_on_their_own_request(lab):
    both = make_person("bo", Role.REQUESTER, Role.APPROVER)
    kill_request = file(both, 4600)
    page = client_for(both).get("/kills/").content.decode()
    assert f"/kills/{kill_request.pk}/approve/" not in page
    assert f"/kills/{kill_request.pk}/cancel/" in page


def test_a_viewer_cannot_approve(lab, requester, viewer):
    kill_request = file(requester, 4600)
    assert client_for(viewer).post(f"/kills/{kill_request.pk}/approve/").status_code == 403


def test_the_request_page_shows_what_changed_before_approval(lab, requester, approver):
    kill_request = file(requester, 4120, include_descendants=True)
    store_snapshot(lab_snapshot(drop=(4123,), replace={4121: proc(4121, ppid=4120, state="D", user="alice",
                                                                  name="pt_data_worker")}))
    page = client_for(approver).get(f"/kills/{kill_request.pk}/").content.decode()
    assert "no longer in the snapshot" in page
    assert "was sleeping, now in uninterruptible sleep (D)" in page
    assert "Approve</button>" in page


def test_the_timeline_polls_until_final_then_answers_286(lab, requester, approver, viewer):
    kill_request = file(requester, 4600)
    client = client_for(viewer)
    live = client.get(f"/kills/{kill_request.pk}/timeline/", **HTMX)
    assert live.status_code == 200
    assert 'hx-trigger="every 2s"' in live.content.decode()
    services.reject(kill_request.pk, approver, "no")
    done = client.get(f"/kills/{kill_request.pk}/timeline/", **HTMX)
    assert done.status_code == 286
    assert "hx-trigger" not in done.content.decode()
    # A final answer takes down the page's old messages ("... approved."): the outcome replaces them.
    assert '<div class="messages" id="messages" hidden hx-swap-oob="true"></div>' in done.content.decode()
    assert 'id="messages"' not in live.content.decode()


def test_the_page_and_the_poll_render_the_same_timeline(lab, requester, viewer):
    kill_request = file(requester, 4600)
    client = client_for(viewer)
    page = client.get(f"/kills/{kill_request.pk}/").content.decode()
    partial = client.get(f"/kills/{kill_request.pk}/timeline/", **HTMX).content.decode().strip()
    assert partial in page


def test_the_new_form_previews_targets_and_files_the_request(lab, requester):
    client = client_for(requester)
    page = client.get("/kills/new/", {"host": "gpu01", "pid": 4120, "start": 412000,
                                      "include_descendants": "on"}).content.decode()
    for pid in (4120, 4121, 4123):
        assert f'data-pid="{pid}"' in page
    assert "Descendants left out" in page and "protected" in page
    response = client.post("/kills/new/", {
        "host": "gpu01", "pid": 4120, "start": 412000, "include_descendants": "on",
        "signal_1": "SIGINT", "grace_1": 5, "signal_2": "SIGKILL", "grace_2": 10,
        "reason": "launcher of a finished job",
    })
    kill_request = KillRequest.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/kills/{kill_request.pk}/"
    assert kill_request.plan == [
        {"signal": "SIGINT", "grace_seconds": 5}, {"signal": "SIGKILL", "grace_seconds": 10}
    ]
    assert kill_request.targets.count() == 3


def test_the_new_form_refuses_a_bad_plan_and_a_missing_reason(lab, requester):
    response = client_for(requester).post("/kills/new/", {
        "host": "gpu01", "pid": 4600, "start": 460000,
        "signal_1": "SIGKILL", "grace_1": 5, "signal_2": "SIGTERM", "grace_2": 5, "reason": "",
    })
    assert response.status_code == 400
    page = response.content.decode()
    assert "SIGKILL can only be the last step" in page
    assert "A reason is required" in page
    assert not KillRequest.objects.exists()


def test_a_plan_row_whose_signal_is_empty_is_dropped_even_with_its_grace_left(lab, requester):
    response = client_for(requester).post("/kills/new/", {
        "host": "gpu01", "pid": 4600, "start": 460000, "reason": "done",
        "signal_1": "SIGTERM", "grace_1": 20, "signal_2": "", "grace_2": 10, "signal_3": "", "grace_3": 5,
    })
    assert response.status_code == 302, response.content.decode()
    assert [step["signal"] for step in KillRequest.objects.get().plan] == ["SIGTERM"]
    missing = client_for(requester).post("/kills/new/", {
        "host": "gpu01", "pid": 4120, "start": 412000, "reason": "done", "signal_1": "SIGTERM", "grace_1": "",
    })
    assert "step 1 (SIGTERM) needs a grace period" in missing.content.decode()


def test_a_process_with_an_open_request_links_to_it_and_the_form_stops_before_it_is_filled(
        lab, requester, viewer):
    kill_request = file(requester, 4600)
    client = client_for(requester)
    host_page = client.get("/hosts/gpu01/").content.decode()
    row = host_page[host_page.index('<tr id="process-4600-460000"'):]
    row = row[:row.index("</tr>")]
    link = f'href="/kills/{kill_request.pk}/"'
    assert f'<a class="open-request" {link}' in row and "Request kill</a>" not in row
    viewer_page = client_for(viewer).get("/hosts/gpu01/").content.decode()
    assert f'{link} title="a kill request for this process is open">#{kill_request.pk}<' in viewer_page
    form = client.get("/kills/new/", {"host": "gpu01", "pid": 4600, "start": 460000}).content.decode()
    assert f'already a target of <a href="/kills/{kill_request.pk}/">request #{kill_request.pk}</a>' in form
    assert "File the request" not in form


def test_a_zombie_preview_offers_its_parent(lab, requester):
    page = client_for(requester).get("/kills/new/", {"host": "gpu01", "pid": 4201, "start": 420100})
    html = page.content.decode()
    assert "Refused:" in html and "zombie" in html
    assert "holds 3 zombies" in html
    assert "pid=4199&amp;start=419900" in html
    assert "File the request" not in html


def test_a_d_state_preview_warns(lab, requester):
    html = client_for(requester).get("/kills/new/", {"host": "gpu01", "pid": 4300, "start": 430000}).content
    assert b"uninterruptible sleep" in html


def test_a_viewer_cannot_open_the_form(lab, viewer):
    response = client_for(viewer).get("/kills/new/", {"host": "gpu01", "pid": 4600, "start": 460000})
    assert response.status_code == 403


def test_process_text_is_escaped_everywhere(requester, approver, db):
    evil = proc(6000, user="mallory", uid=1666, name="<script>x</script>",
                cmdline=["python", "<img src=x onerror=alert(1)>", "\u202egnp.exe"])
    doc = lab_snapshot()
    doc["processes"].append(evil)
    store_snapshot(doc)
    kill_request = file(requester, 6000, reason="<b>bold</b> reason")
    client = client_for(approver)
    pages = [
        client.get("/kills/").content.decode(),
        client.get(f"/kills/{kill_request.pk}/").content.decode(),
        client_for(requester).get("/kills/new/", {"host": "gpu01", "pid": 6000, "start": 600000})
        .content.decode(),
    ]
    for html in pages:
        assert "<script>x</script>" not in html
        assert "<img src=x" not in html
        assert "\u202e" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in pages[1]
    assert "&lt;b&gt;bold&lt;/b&gt; reason" in pages[1]


@pytest.mark.usefixtures("lab", "sent")
def test_a_finished_request_shows_its_steps_outcomes_and_released_memory(
    requester, approver, viewer, approve_committed
):
    from datetime import UTC, datetime, timedelta

    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    at = datetime.now(UTC) - timedelta(seconds=30)
    for seq, kind, extra in [
        (1, "started", {}),
        (2, "signal_sent", {"pid": 4600, "start_time_ticks": 460000, "signal": "SIGINT", "method": "kill",
                            "detail": "sent SIGINT; via kill(), pidfds unavailable"}),
        (3, "target_exited", {"pid": 4600, "start_time_ticks": 460000, "signal": "SIGINT",
                              "detail": "exited (after SIGINT, 0.40 s after it was sent)"}),
        (4, "finished", {"result": "succeeded", "detail": "every target not refused is gone"}),
    ]:
        services.record_progress({"request_id": kill_request.order_request_id, "seq": seq, "event": kind,
                                  "at": (at + timedelta(seconds=seq)).isoformat(), **extra})
    client = client_for(viewer)
    page = client.get(f"/kills/{kill_request.pk}/").content.decode()
    assert "Waiting for a later snapshot" in page
    assert "via kill(), pidfds unavailable" in page and ">kill()</span>" in page
    assert "exited (after SIGINT, 0.40 s after it was sent)" in page
    KillRequest.objects.filter(pk=kill_request.pk).update(
        memory_released_bytes=kill_request.memory_expected_release_bytes,
        memory_confirmed_at=datetime.now(UTC),
    )
    timeline = client.get(f"/kills/{kill_request.pk}/timeline/", **HTMX)
    assert timeline.status_code == 286
    text = timeline.content.decode()
    assert "Memory released</span>: 1 GiB of 1 GiB" in text
    # The outcome leads: memory released first, and the gone targets are not shown as still sleeping.
    assert text.index("<strong>Memory released: 1 GiB of 1 GiB</strong>") < text.index("<h2>Targets</h2>")
    assert 'data-label="State"' not in text and "GPU memory held before" in text


def test_a_plain_form_post_decides_and_redirects_with_a_message(lab, requester, approver):
    kill_request = file(requester, 4600)
    response = client_for(approver).post(f"/kills/{kill_request.pk}/reject/", {"reason": "not now"},
                                         follow=True)
    assert response.redirect_chain[-1][0] == f"/kills/{kill_request.pk}/"
    assert f"Request #{kill_request.pk} rejected." in response.content.decode()


def test_an_approver_cancels_from_the_list(lab, requester, approver):
    kill_request = file(requester, 4600)
    row = client_for(approver).post(f"/kills/{kill_request.pk}/cancel/", **HTMX)
    assert row.status_code == 200 and "Cancelled" in row.content.decode()
    assert refreshed(kill_request).status == Status.CANCELLED


def test_a_viewer_cannot_cancel(lab, requester, viewer):
    kill_request = file(requester, 4600)
    row = client_for(viewer).post(f"/kills/{kill_request.pk}/cancel/", **HTMX).content.decode()
    assert "Only the requester or an approver can cancel" in row
    assert refreshed(kill_request).status == Status.PENDING


def changes_seen_on(page: str, pk: int) -> str:
    """The 'what changed' digest the Approve form of request ``pk`` on ``page`` carries."""
    import re

    form = page[page.index(f'action="/kills/{pk}/approve/"'):]
    return re.search(r'name="changes_seen" value="([0-9a-f]*)"', form).group(1)


def test_approve_is_refused_when_the_targets_changed_after_the_page_was_shown(
    lab, requester, approver, sent, django_capture_on_commit_callbacks
):
    kill_request = file(requester, 4120, include_descendants=True)
    client = client_for(approver)
    seen = changes_seen_on(client.get(f"/kills/{kill_request.pk}/").content.decode(), kill_request.pk)
    assert seen == ""  # nothing changed yet
    store_snapshot(lab_snapshot(drop=(4123,)))  # a target exits after the page was shown
    refused = client.post(f"/kills/{kill_request.pk}/approve/", {"changes_seen": seen}, follow=True)
    assert "Something changed since this page was shown" in refused.content.decode()
    assert refreshed(kill_request).status == Status.PENDING
    # The page now shows the change; approving what it shows works.
    seen = changes_seen_on(refused.content.decode(), kill_request.pk)
    assert seen and "no longer in the snapshot" in refused.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/kills/{kill_request.pk}/approve/", {"changes_seen": seen})
    assert refreshed(kill_request).status == Status.APPROVED


def test_the_list_approves_with_the_same_check(lab, requester, approver, sent):
    kill_request = file(requester, 4120, include_descendants=True)
    client = client_for(approver)
    seen = changes_seen_on(client.get("/kills/").content.decode(), kill_request.pk)
    store_snapshot(lab_snapshot(drop=(4123,)))
    row = client.post(f"/kills/{kill_request.pk}/approve/", {"changes_seen": seen}, **HTMX).content.decode()
    assert "Something changed since this page was shown" in row
    assert "no longer in the snapshot" in row  # the list shows what changed, open
    assert refreshed(kill_request).status == Status.PENDING


def test_only_approvers_see_before_approving_and_the_targets_are_listed_once(lab, requester, approver):
    kill_request = file(requester, 4600)
    as_requester = client_for(requester).get(f"/kills/{kill_request.pk}/").content.decode()
    assert "Before approving" not in as_requester
    assert as_requester.count('data-pid="4600"') == 1
    as_approver = client_for(approver).get(f"/kills/{kill_request.pk}/").content.decode()
    assert "Before approving" in as_approver
    assert as_approver.count('data-pid="4600"') == 1
    # The status leads the page, above the request's facts.
    assert as_approver.index("kill-status-pending") < as_approver.index("Requested by")


def test_memory_moving_again_between_two_snapshots_does_not_stop_an_approval(
    lab, requester, approver, sent, django_capture_on_commit_callbacks
):
    from tests.factories import GiB
    from tests.kills.helpers import GPU1

    def holding(gib: int) -> dict:
        return lab_snapshot(replace={4600: proc(4600, user="carol", uid=1002, name="python",
                                                cmdline=["python", "eval.py"], gpu_memory={GPU1: gib * GiB})})

    kill_request = file(requester, 4600)
    client = client_for(approver)
    store_snapshot(holding(2))
    seen = changes_seen_on(client.get(f"/kills/{kill_request.pk}/").content.decode(), kill_request.pk)
    assert seen  # "GPU memory 1 GiB → 2 GiB" was shown
    store_snapshot(holding(3))  # the amount moved again: the same kind of news, already seen
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/kills/{kill_request.pk}/approve/", {"changes_seen": seen})
    assert refreshed(kill_request).status == Status.APPROVED
