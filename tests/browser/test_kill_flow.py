"""The whole kill workflow in a real browser, on real servers.

A requester logs in, opens the host, requests a kill with a reason and logs
out; an approver logs in, is sent to re-authenticate (the login is made to
look 16 minutes old), sees the request named there, and the password alone approves it
(no second press of Approve); then watches the timeline until the real
target process is gone; the audit page shows every step. The target's
command line is hostile throughout: every page is checked for live payloads
and CSP violations, and a screenshot of each is kept.

Servers: redis-server, a central Celery worker on this test's database, an
agent Celery worker (no database) with a simulated GPU that the target holds;
the pages come from live_server in this process, which publishes to Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.contrib.sessions.backends.db import SessionStore

from gpuadmin.accounts import sudo
from gpuadmin.accounts.roles import Role
from gpuadmin.audit.models import AuditEvent
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.kills.models import KillRequest
from tests.browser.helpers import (
    CLEAN_DOM,
    HOSTILE_ARGS,
    NO_LIVE_PAYLOAD,
    PWNED_PATHS,
    VISIBLE_CONTROLS,
    log_in,
    log_out,
)
from tests.integration.helpers import GiB, start_central_and_agent, wait_until, write_gpus
from tests.kills.helpers import TRAINER
from tests.people import PASSWORD, make_person

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


TIMEOUT_SECONDS = 60


def start_hostile_trainer(directory: Path) -> subprocess.Popen:
    """A trainer that ignores SIGINT and exits on SIGTERM, its command line full of payloads."""
    argv = [sys.executable, "-c", TRAINER, str(directory / "checkpoint.txt"), "ignore-sigint", *HOSTILE_ARGS]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def age_login(context, seconds: float) -> None:
    """Make the browser's login look older than it is (its session, as stored)."""
    key = next(c["value"] for c in context.cookies() if c["name"] == "sessionid")
    session = SessionStore(session_key=key)
    mark = session[sudo.SESSION_KEY]
    session[sudo.SESSION_KEY] = {**mark, "at": mark["at"] - seconds}
    session.save()


def check_page(page, guard, screenshot, name: str) -> None:
    page.wait_for_load_state("networkidle")
    screenshot(page, name)
    assert page.evaluate(NO_LIVE_PAYLOAD) == CLEAN_DOM, name
    guard.assert_clean()


def test_request_reauthenticate_approve_and_watch_the_target_go(  # noqa: PLR0917 - fixtures
    live_server, guarded_page, screenshot, start_worker, redis_server, publish_to, tmp_path,
):
    page, guard = guarded_page
    make_person("rick", Role.REQUESTER)
    make_person("april", Role.APPROVER)
    host_name = f"browser-{uuid.uuid4().hex[:8]}"
    trainer = start_hostile_trainer(tmp_path)
    gpus_file = tmp_path / "gpus.json"
    write_gpus(gpus_file, {trainer.pid: 6 * GiB})
    publish_to(redis_server.url)
    try:
        workers = start_central_and_agent(start_worker, host_name, tmp_path, gpus_file)
        wait_until("the trainer in a snapshot", lambda: any(
            p["pid"] == trainer.pid
            for s in LatestSnapshot.objects.filter(host__name=host_name)
            for p in s.document["processes"]), workers)

        # The requester: host page, request a kill with a reason, log out.
        log_in(page, live_server.url, "rick")
        page.goto(f"{live_server.url}/hosts/{host_name}/")
        check_page(page, guard, screenshot, "requester-host")
        assert all(shown in page.inner_text("main") for shown in VISIBLE_CONTROLS)
        page.click(f'a.request-kill[href*="pid={trainer.pid}&"]')
        check_page(page, guard, screenshot, "requester-new-request")
        page.fill("textarea[name=reason]", "browser test: finished job still holding 6 GiB")
        with page.expect_navigation():
            page.click("text=File the request")
        check_page(page, guard, screenshot, "requester-filed")
        kill_request = KillRequest.objects.get(host__name=host_name)
        assert page.url.endswith(f"/kills/{kill_request.pk}/")
        log_out(page)

        # The approver: an old login is sent to re-authenticate, comes back, approves.
        log_in(page, live_server.url, "april")
        age_login(page.context, 16 * 60)
        page.goto(f"{live_server.url}/kills/{kill_request.pk}/")
        check_page(page, guard, screenshot, "approver-request")
        with page.expect_navigation():
            page.click("button:text-is('Approve')")
        assert "/reauthenticate/" in page.url
        check_page(page, guard, screenshot, "approver-reauthenticate")
        # The page names the request; the password finishes the approval: no second Approve.
        assert f"Approve kill request #{kill_request.pk} on {host_name}" in page.inner_text("main")
        page.fill("#reauth-password", PASSWORD)
        with page.expect_navigation():
            page.click("button:text-is('Confirm')")
        assert page.url.endswith(f"/kills/{kill_request.pk}/")
        assert f"Request #{kill_request.pk} approved." in page.inner_text("main")
        assert KillRequest.objects.get(pk=kill_request.pk).approved_by_name == "april"
        # The timeline polls (htmx) until the request is final.
        page.wait_for_selector("#timeline .kill-status-succeeded", timeout=TIMEOUT_SECONDS * 1000)
        # The outcome replaces what the page said before: "approved" is not left standing over "Succeeded".
        page.wait_for_selector("#messages", state="hidden", timeout=10_000)
        assert "approved." not in page.inner_text("main")
        trainer.wait(timeout=10)  # the real target process is gone
        check_page(page, guard, screenshot, "approver-timeline")
        timeline = page.inner_text("#timeline")
        assert "SIGTERM" in timeline

        # The audit page shows every step.
        page.goto(f"{live_server.url}/audit/?kill_request={kill_request.pk}")
        check_page(page, guard, screenshot, "audit")
        story = page.inner_text("#audit-results")
        number = kill_request.pk
        for words in (f"rick requested #{number}", f"april approved #{number}",
                      f"central sent the order of #{number} to {host_name}", f"{host_name} started #{number}",
                      f"{host_name} sent SIGINT to PID {trainer.pid}", f"{host_name} sent SIGTERM",
                      "exited after SIGTERM", f"#{number} succeeded"):
            assert words in story, words
        actions = list(AuditEvent.objects.order_by("sequence").values_list("action", flat=True))
        assert actions.index("reauthenticated") < actions.index("approved")
        assert not [url for url in guard.requests if url.endswith(PWNED_PATHS)]
        assert json.loads(json.dumps(guard.violations())) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
