"""The order sent to the host: its format, its queue, its expiry, and re-sending."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from gpuadmin.celery import app
from gpuadmin.kills import services
from gpuadmin.kills.services import dispatch, sweeper
from gpuadmin.kills.states import Status
from gpuadmin.wire.kill_order import validate_order, verify_order
from gpuadmin.wire.kill_protocol import ORDER_VERSION
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER
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


# --- a cancel racing the send: the request's row lock puts one after the other ----------

# How long a cancel from another connection is given while the order is being sent.
# Unhindered it commits in milliseconds; held by the row lock, it cannot.
CANCEL_WAIT_SECONDS = 1.5


class CancelInAnotherConnection(threading.Thread):
    """The requester cancels from another thread, with its own database connection (another web request)."""

    def __init__(self, kill_request_id: int, user: Any) -> None:
        super().__init__()
        self.kill_request_id, self.user = kill_request_id, user
        self.outcome = ""

    def run(self) -> None:
        try:
            services.cancel(self.kill_request_id, self.user, "changed my mind")
            self.outcome = "cancelled"
        except services.Conflict as conflict:
            self.outcome = conflict.message
        finally:
            connection.close()


def _approved_but_not_sent(requester, approver, broker_down) -> Any:
    """Approved while the broker was down: cancellable, and the sweeper's to send."""
    broker_down(True)
    kill_request = file(requester, 4600)
    services.approve(kill_request.pk, approver)  # commits; its own send fails
    broker_down(False)
    kill_request = refreshed(kill_request)
    assert kill_request.is_cancellable
    return kill_request


def _run_first(action: Callable[[], None], then: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        action()
        return then(*args, **kwargs)

    return wrapped


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.usefixtures("lab")
@pytest.mark.parametrize("moment", ["after_reading_the_request", "during_the_publish"])
def test_a_cancel_while_the_order_is_being_sent_waits_and_is_refused(  # noqa: PLR0917 - fixtures
    moment, requester, approver, broker_down, sent, monkeypatch
):
    kill_request = _approved_but_not_sent(requester, approver, broker_down)
    canceller = CancelInAnotherConnection(kill_request.pk, requester)
    finished_while_sending: list[bool] = []

    def cancel_meanwhile() -> None:
        canceller.start()
        canceller.join(timeout=CANCEL_WAIT_SECONDS)
        finished_while_sending.append(not canceller.is_alive())

    if moment == "during_the_publish":
        send_task = app.send_task

        def send_task_meanwhile(name: str, *args: Any, **kwargs: Any) -> Any:
            if name == EXECUTE_KILL_ORDER:
                cancel_meanwhile()
            return send_task(name, *args, **kwargs)

        monkeypatch.setattr(app, "send_task", send_task_meanwhile)
    else:
        # After send_order read the request, before it publishes.
        monkeypatch.setattr(dispatch, "build_order", _run_first(cancel_meanwhile, dispatch.build_order))

    result = services.sweep(now=timezone.now() + timedelta(seconds=5))
    canceller.join(timeout=30)

    assert finished_while_sending == [False]  # it waited for the send to commit
    assert result.resent == 1 and len(sent.orders()) == 1
    assert "already sent" in canceller.outcome
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.APPROVED and kill_request.dispatched_at is not None
    assert actions(kill_request) == ["requested", "approved", "dispatched"]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.usefixtures("lab")
def test_a_cancel_committed_after_the_sweeper_listed_the_request_means_nothing_is_sent(
    requester, approver, broker_down, sent, monkeypatch
):
    kill_request = _approved_but_not_sent(requester, approver, broker_down)
    canceller = CancelInAnotherConnection(kill_request.pk, requester)

    def cancel_to_the_end() -> None:
        canceller.start()
        canceller.join(timeout=30)

    # Between the sweeper's unlocked list of unsent orders and the send of this one.
    monkeypatch.setattr(sweeper, "send_order", _run_first(cancel_to_the_end, sweeper.send_order))
    result = services.sweep(now=timezone.now() + timedelta(seconds=5))

    assert canceller.outcome == "cancelled"
    assert result.resent == 0 and sent.orders() == []
    kill_request = refreshed(kill_request)
    assert kill_request.status == Status.CANCELLED and kill_request.dispatched_at is None
    assert actions(kill_request) == ["requested", "approved", "cancelled"]


@pytest.fixture
def anchored(settings, tmp_path, lab):
    """The audit chain's head anchored (gpuadmin/audit/anchors.py) before the request is filed."""
    from gpuadmin.audit import anchors, log
    from gpuadmin.audit.models import Action

    settings.GPUADMIN_AUDIT_ANCHOR_FILE = tmp_path / "audit-anchors.jsonl"
    log.record(Action.HOST_ACCEPTED, host_name=lab.name, details={"fingerprint": lab.key_fingerprint})
    return anchors.publish()


def test_the_order_carries_the_newest_anchor_into_the_agents_journal(anchored, approved, sent, tmp_path):
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from gpuadmin.probe.journal import Journal
    from tests.audit.helpers import audit_table, tamper

    order = verify_order(sent.orders()[0], central_key=settings.GPUADMIN_CENTRAL_PUBLIC_KEY,
                         host_name="gpu01", now=time.time())
    validate_order(order)  # the agent reads the order as before; it ignores the anchor
    journal = Journal(tmp_path / "agent-journal")
    journal.claim(order["request_id"], {"order": order}).close()  # the agent's claim keeps the order
    settings.GPUADMIN_AUDIT_ANCHOR_FILE.unlink()  # central's own anchor file is gone

    out = StringIO()
    call_command("verify_audit", "--anchor-file", str(journal.directory), stdout=out)
    said = out.getvalue()
    assert f"events up to {anchored.sequence} are as the anchor of event {anchored.sequence}" in said
    tamper(f"UPDATE {audit_table()} SET actor_name = 'mallory', hash = %s WHERE sequence = %s",
           ("0" * 64, anchored.sequence))
    with pytest.raises(CommandError, match=f"event {anchored.sequence} has hash 0000000000000000…, not"):
        call_command("verify_audit", "--anchor-file", str(journal.directory), stdout=StringIO())
