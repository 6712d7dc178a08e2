"""Kill reports count only when the accepted key of the request's host signed them (receive_report)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.audit.models import AuditEvent
from gpuadmin.audit.sentences import describe, sentence_text
from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Finding, Host
from gpuadmin.kills import services
from gpuadmin.kills.models import KillStep
from gpuadmin.kills.states import Status
from gpuadmin.wire.kill_protocol import OrderRefusal, order_refused_event
from gpuadmin.wire.signing import generate_private_key
from tests.keys import accept, host_key, signed_report
from tests.kills.helpers import file, refreshed

pytestmark = pytest.mark.django_db


@pytest.fixture
def approved(lab, requester, approver, sent, approve_committed):
    kill_request = file(requester, 4600)
    approve_committed(kill_request, approver)
    return refreshed(kill_request)


def finished(kill_request, **fields) -> dict:
    return {"request_id": kill_request.order_request_id, "seq": 1, "event": "finished", "result": "refused",
            "at": datetime.now(UTC).isoformat(), "detail": "forged", **fields}


def assert_rejected_on_gpu01(count: int = 1) -> None:
    host = Host.objects.get(name="gpu01")
    assert host.rejected_message_count == count
    assert host.findings.open().filter(kind=Finding.Kind.REJECTED_MESSAGES).exists()
    assert AuditEvent.objects.filter(action="message_rejected", host_name="gpu01").exists()


@pytest.mark.parametrize("forge", [
    pytest.param(finished, id="unsigned"),
    pytest.param(lambda r: signed_report(finished(r), "gpu01", key=generate_private_key()), id="another-key"),
    pytest.param(lambda r: signed_report(finished(r), "gpu02"), id="another-hosts-key-and-name"),
    pytest.param(lambda r: signed_report(finished(r), "gpu01", key=host_key("gpu02")),
                 id="another-hosts-key"),
    pytest.param(lambda r: signed_report(finished(r, request_id=str(r.pk)), "gpu01"), id="bare-number"),
    pytest.param(lambda r: signed_report(finished(r, request_id=f"{r.pk}-0123abcd"), "gpu01"),
                 id="wrong-key"),
])
def test_a_forged_report_changes_nothing_and_is_counted_shown_and_audited(approved, forge) -> None:
    accept("gpu02")
    assert services.receive_report(forge(approved)) is None
    assert refreshed(approved).status == Status.APPROVED
    assert not KillStep.objects.exists()
    assert_rejected_on_gpu01()


def test_a_report_signed_by_its_host_is_recorded(approved) -> None:
    step = services.receive_report(signed_report(finished(approved, detail="nothing to do"), "gpu01"))
    assert step is not None and refreshed(approved).status == Status.REFUSED


def test_a_different_report_for_a_stored_step_is_recorded_as_a_conflict(approved) -> None:
    first = {**finished(approved), "event": "started", "detail": "executing"}
    services.receive_report(signed_report(first, "gpu01"))
    services.receive_report(signed_report(first, "gpu01"))  # a plain repeat: nothing
    assert not AuditEvent.objects.filter(action="report_conflict").exists()

    services.receive_report(signed_report({**first, "detail": "something else"}, "gpu01"))

    conflict = AuditEvent.objects.get(action="report_conflict")
    assert conflict.kill_request_id == approved.pk and "something else" in conflict.details["received"]
    assert KillStep.objects.get().detail == "executing"


def test_a_signed_order_refusal_is_audited_and_changes_no_request(approved) -> None:
    event = order_refused_event(approved.order_request_id, at=datetime.now(UTC).isoformat(),
                                reason=OrderRefusal.BAD_SIGNATURE, detail="the signature does not verify")
    services.receive_report(signed_report(event, "gpu01"))
    refusal = AuditEvent.objects.get(action="order_refused")
    assert refusal.kill_request_id == approved.pk
    assert refusal.details["summary"] == "order refused by host: bad_signature: the signature does not verify"
    assert refreshed(approved).status == Status.APPROVED


def test_another_hosts_order_refusal_naming_a_request_is_not_attached_to_it(approved) -> None:
    # gpu02 read gpu01's order (its request id and key) off a queue, and signs a refusal of it.
    accept("gpu02")
    event = order_refused_event(approved.order_request_id, at=datetime.now(UTC).isoformat(),
                                reason=OrderRefusal.WRONG_HOST, detail="the order is for gpu01")
    services.receive_report(signed_report(event, "gpu02"))
    refusal = AuditEvent.objects.get(action="order_refused")
    assert refusal.host_name == "gpu02"
    assert refusal.kill_request_id is None  # as for a request central never ordered
    assert refusal.details["claimed_request_id"] == approved.order_request_id
    assert not AuditEvent.objects.filter(action="order_refused", kill_request_id=approved.pk).exists()
    assert refreshed(approved).status == Status.APPROVED


def test_an_order_refusal_not_signed_by_the_host_is_a_rejected_message(approved) -> None:
    event = order_refused_event("999", at=datetime.now(UTC).isoformat(), reason=OrderRefusal.UNSIGNED,
                                detail="x")
    services.receive_report(signed_report(event, "gpu01", key=generate_private_key()))
    assert not AuditEvent.objects.filter(action="order_refused").exists()
    assert_rejected_on_gpu01()


def refusal(approved, n: int) -> dict:
    """A junk message's refusal as the agent signs it, distinct for each ``n``."""
    event = order_refused_event(f"{900 + n}-0123abcd", at=datetime.now(UTC).isoformat(),
                                reason=OrderRefusal.UNSIGNED, detail=f"junk message {n}")
    return signed_report(event, "gpu01")


def test_a_signed_refusal_replayed_50_times_is_written_once_and_counted(approved) -> None:
    replayed = refusal(approved, 1)
    for _ in range(50):
        services.receive_report(replayed)
    assert AuditEvent.objects.filter(action="order_refused").count() == 1
    host = Host.objects.get(name="gpu01")
    assert (host.order_refusal_count, host.order_refusals_unwritten_count) == (50, 49)


def test_a_flood_of_refusals_is_bounded_per_host_and_the_next_written_one_says_how_many_were_not(
        approved, monkeypatch) -> None:
    for n in range(20):
        services.receive_report(refusal(approved, n))
    written = AuditEvent.objects.filter(action="order_refused", host_name="gpu01")
    assert written.count() == trust.ORDER_REFUSALS_AUDITED_PER_WINDOW == 10
    assert Host.objects.get(name="gpu01").order_refusals_unwritten_count == 10
    # Real events are never bounded: the request's own progress is still recorded and audited.
    started = {**finished(approved), "event": "started", "detail": "executing"}
    assert services.receive_report(signed_report(started, "gpu01")) is not None
    assert AuditEvent.objects.filter(action="started", kill_request_id=approved.pk).exists()

    monkeypatch.setattr(trust, "ORDER_REFUSAL_WINDOW", timedelta(microseconds=1))  # the window closed
    services.receive_report(refusal(approved, 99))
    newest = written.order_by("-sequence").first()
    assert newest is not None and newest.details["not_written_before"] == 10
    assert "10 more refusals from this host" in sentence_text(describe(newest))
    host = Host.objects.get(name="gpu01")
    assert (host.order_refusal_count, host.order_refusals_unwritten_count) == (21, 0)
