"""The order sent to the host: its format, its queue, its expiry, and re-sending."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from gpuadmin.kills import services
from gpuadmin.kills.states import Status
from gpuadmin.probe.kill import validate_order
from gpuadmin.probe.kill.order import verify_order
from gpuadmin.probe.kill.protocol import ORDER_VERSION
from gpuadmin.task_names import EXECUTE_KILL_ORDER
from tests.kills.helpers import actions, file, refreshed

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(lab, requester, approver, sent, approve_committed):
    plan = [{"signal": "SIGINT", "grace_seconds": 3}, {"signal": "SIGKILL", "grace_seconds": 2}]
    kill_request = file(requester, 4120, include_descendants=True, plan=plan)
    approve_committed(kill_request, approver)
    return refreshed(kill_request)


def test_the_order_is_self_contained_signed_and_valid_for_the_agent(approved, sent):
    (name, args, options), = sent
    assert name == EXECUTE_KILL_ORDER
    assert options["queue"] == "host.gpu01"
    # The agent's own check: central's signature (the key it pins), its host, its deadline.
    order = verify_order(args[0], central_key=settings.GPUADMIN_CENTRAL_PUBLIC_KEY, host_name="gpu01",
                         now=time.time())
    assert options["expires"] == datetime.fromisoformat(order["host_deadline"])
    assert order["order_version"] == ORDER_VERSION
    assert order["request_id"] == f"{approved.pk}-{approved.order_key}"
    assert order["host"] == "gpu01"
    assert order["boot_id"] == approved.boot_id
    assert datetime.fromisoformat(order["deadline"]) == approved.start_deadline
    assert order["deadline"].endswith("Z")
    assert order["plan"] == approved.plan
    assert order["approved_by"] == "april"
    assert [(t["pid"], t["start_time_ticks"], t["user"]) for t in order["targets"]] == [
        (4120, 412000, "alice"), (4121, 412100, "alice"), (4123, 412300, "alice")
    ]
    parsed = validate_order(order)  # the agent's own reading of it
    assert parsed.targets[0].cmdline_sha256 == approved.targets.get(pid=4120).cmdline_sha256


@pytest.mark.usefixtures("lab")
def test_a_broker_down_at_approval_leaves_the_order_for_the_sweeper(
    requester, approver, broker_down, sent, approve_committed
):
    broker_down(True)
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)  # the approval itself succeeds
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.APPROVED
    assert kill_request.dispatched_at is None
    assert kill_request.dispatch_attempts == 1
    assert "Connection refused" in kill_request.last_dispatch_error
    assert actions(kill_request) == ["requested", "approved"]

    broker_down(False)
    result = services.sweep(now=timezone.now() + timedelta(seconds=5))
    assert result.resent == 1
    kill_request = refreshed(kill_request)
    assert kill_request.dispatched_at is not None
    assert len(sent.orders()) == 1
    assert actions(kill_request) == ["requested", "approved", "dispatched"]


def test_the_sweeper_does_not_resend_what_already_left(approved, sent):
    services.sweep(now=timezone.now() + timedelta(seconds=5))
    assert len(sent.orders()) == 1


@pytest.mark.usefixtures("lab")
def test_the_sweeper_does_not_race_the_approvals_own_send(
    requester, approver, broker_down, sent, approve_committed
):
    broker_down(True)
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    broker_down(False)
    assert services.sweep().resent == 0  # just approved: its own send is still in charge
    assert sent.orders() == []


@pytest.mark.usefixtures("lab")
def test_an_order_never_sent_before_its_deadline_expires(
    requester, approver, broker_down, sent, approve_committed
):
    broker_down(True)
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    broker_down(False)
    result = services.sweep(now=refreshed(kill_request).start_deadline + timedelta(seconds=31))
    assert result.expired == 1 and result.resent == 0
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.EXPIRED
    assert "could not be sent" in kill_request.result_detail
    assert sent.orders() == []
    assert actions(kill_request)[-1] == "expired"
