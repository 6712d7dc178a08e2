"""Self-service and fair use in a real browser.

A person stops their own real process from "My GPUs" with no approver (the order runs through the
agent's own code in this process), and cannot stop another person's: there is no button for it,
and a form altered to name it is refused by central. A dry-run policy lists the idle holder; a
live one notifies its owner, then files a kill request that waits for an approver.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from gpuadmin.accounts.roles import Role
from gpuadmin.agent import killing
from gpuadmin.celery import app
from gpuadmin.fairuse import services as fairuse
from gpuadmin.fairuse.models import Policy
from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest
from gpuadmin.notify.models import Account, Person
from gpuadmin.probe import procfs
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER
from tests.factories import GiB, gpu, proc, snapshot
from tests.keys import deliver, install_agent_key
from tests.kills.helpers import real_record, start_trainer
from tests.people import make_person

# The live server reads in its own thread what the test wrote: committed data.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

GPU0 = "GPU-sim-0000"
OTHER_UID = os.getuid() + 4242


def person(username: str, name: str, uid: int):
    user = make_person(username, Role.VIEWER)
    Account.objects.create(person=Person.objects.create(name=name, user=user), uid=uid)
    return user


def test_a_person_stops_their_own_process_and_not_another_persons(
    open_page, tmp_path, settings, monkeypatch
):
    orders = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, **kw: name == EXECUTE_KILL_ORDER
                        and orders.append(args[0]))
    settings.DATA_DIR = tmp_path / "agent-data"
    settings.GPUADMIN_HOST_NAME = "gpu01"
    install_agent_key(settings.DATA_DIR, "gpu01")
    monkeypatch.setattr(killing, "report_to_central",
                        lambda event: services.receive_report(killing.signed_report(event)))
    alice = person("alice", "Alice", os.getuid())
    person("bob", "Bob", OTHER_UID)
    child, _ = start_trainer(tmp_path, "checkpoint-on-sigint")
    deliver(snapshot("gpu01", boot_id=procfs.read_boot_id(), gpus=[gpu(0, used=7 * GiB)], processes=[
        real_record(child.pid, gpu_memory={GPU0: 3 * GiB}),
        proc(4300, uid=OTHER_UID, user="bob", cmdline=["python", "bobs.py"], gpu_memory={GPU0: 4 * GiB}),
    ]))

    page = open_page(alice)
    page.goto("/me/gpus/")
    mine = page.locator("#my-gpus")
    expect(mine.get_by_role("button", name=f"Stop PID {child.pid}")).to_be_visible()
    expect(page.get_by_role("button", name="Stop PID 4300")).to_have_count(0)
    expect(page.locator("#others")).to_contain_text("bobs.py")

    # A form altered to name Bob's process: central refuses it, nothing is filed.
    page.locator("#my-gpus input[name=pid]").evaluate("input => input.value = '4300'")
    page.locator("#my-gpus input[name=start_time_ticks]").evaluate("input => input.value = '430000'")
    mine.get_by_role("button", name=f"Stop PID {child.pid}").click()
    expect(page.get_by_role("alert")).to_contain_text("not yours on gpu01")
    assert not KillRequest.objects.exists() and orders == []

    page.get_by_role("button", name=f"Stop PID {child.pid}").click()
    expect(page.get_by_role("status")).to_contain_text("self-service")
    kill_request = KillRequest.objects.get()
    assert kill_request.status == "approved" and kill_request.self_service
    assert killing.execute(orders[-1])["result"] == "succeeded"
    child.wait(timeout=10)
    page.reload()
    expect(page.locator("body")).to_contain_text("Succeeded")


def test_a_dry_run_policy_lists_the_idle_holder_and_a_live_one_notifies_then_files_a_request(open_page):
    alice = person("alice", "Alice", 1000)
    start = timezone.now().replace(microsecond=0) - timedelta(hours=3)

    def idle_at(minute: int) -> None:
        deliver(snapshot("gpu01", taken_at=start + timedelta(minutes=minute), gpus=[gpu(0, used=10 * GiB)],
                         processes=[proc(4120, uid=1000, user="alice", name="idle-holder",
                                         cmdline=["python", "idle_holder.py"], gpu_memory={GPU0: 10 * GiB})]),
                received_at=start + timedelta(minutes=minute))

    for minute in range(0, 100, 5):
        idle_at(minute)
    dry = Policy.objects.create(name="idle dry run", condition=Policy.Condition.IDLE_HOLDER, minutes=60)
    page = open_page(alice)
    page.goto(f"/fair-use/policies/{dry.pk}/")
    expect(page.locator("#dry-run")).to_contain_text("idle-holder (pid 4120)")
    expect(page.locator("#dry-run")).to_contain_text("alice")

    live = Policy.objects.create(name="idle live", condition=Policy.Condition.IDLE_HOLDER, minutes=60,
                                 mode=Policy.Mode.LIVE, notify_again_after_minutes=30,
                                 request_after_minutes=30)
    fairuse.evaluate(now=start + timedelta(minutes=95))
    page.goto("/me/gpus/")
    page.locator("a", has_text="idle_holder.py").click()
    expect(page.locator(".case-status")).to_have_text("Owner notified")
    for minute in (126, 157):  # the host keeps reporting: a stale one would pause the policy
        idle_at(minute)
        fairuse.evaluate(now=start + timedelta(minutes=minute))
    page.reload()
    expect(page.locator(".case-status")).to_contain_text("Kill requested")
    expect(page.locator("body")).to_contain_text("Pending approval")
    assert live.cases.get().kill_request.status == "pending"
