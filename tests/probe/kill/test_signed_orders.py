"""verify_order: only an order central signed, for this host, in time, is handed to the executor."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.probe.journal import Journal
from gpuadmin.probe.kill import execute_order
from gpuadmin.wire.kill_order import OrderRefused, verify_order
from gpuadmin.wire.kill_protocol import MAX_ORDER_WINDOW_SECONDS, OrderRefusal
from gpuadmin.wire.signing import MessageKind, generate_private_key, public_key_text, seal
from tests.probe.kill.helpers import Processes, Reports, SignalSpy, make_order, target_for

CENTRAL = generate_private_key()
CENTRAL_PUBLIC = public_key_text(CENTRAL)
HOST = "testhost"


def verify(message: object, *, now: float | None = None, host: str = HOST) -> dict:
    return verify_order(message, central_key=CENTRAL_PUBLIC, host_name=host,
                        now=time.time() if now is None else now)


def refusal(message: object, **kwargs: object) -> OrderRefused:
    with pytest.raises(OrderRefused) as refused:
        verify(message, **kwargs)
    return refused.value


def signed(order: dict, key=CENTRAL) -> dict:
    return seal(order, MessageKind.ORDER, key)


def order_for(pid: int = 4120, **kwargs: object) -> dict:
    target = {"pid": pid, "start_time_ticks": 1, "uid": 0, "user": "root", "name": "x",
              "cmdline_sha256": "ab" * 32}
    return make_order([target], **kwargs)


def test_an_order_central_signed_for_this_host_passes() -> None:
    order = order_for()
    assert verify(signed(order)) == order


def test_an_unsigned_order_with_a_made_up_request_id_is_refused() -> None:
    forged = order_for(request_id="999", plan=[{"signal": "SIGKILL", "grace_seconds": 1}])
    refused = refusal(forged)
    assert refused.reason is OrderRefusal.UNSIGNED and refused.request_id == "999"


def test_an_order_signed_by_another_key_is_refused() -> None:
    refused = refusal(signed(order_for(), key=generate_private_key()))
    assert refused.reason is OrderRefusal.BAD_SIGNATURE and "not by the trusted key" in refused.detail


@pytest.mark.parametrize(("old", "new"), [('"pid":4120', '"pid":4121'), ('"SIGINT"', '"SIGKILL"')])
def test_an_order_changed_in_any_byte_is_refused(old: str, new: str) -> None:
    message = signed(order_for())
    assert old in message["text"]
    message["text"] = message["text"].replace(old, new)
    assert refusal(message).reason is OrderRefusal.BAD_SIGNATURE


def test_an_order_for_another_host_is_refused() -> None:
    assert refusal(signed(order_for()), host="gpu99").reason is OrderRefusal.WRONG_HOST


def test_an_order_past_its_deadline_is_refused() -> None:
    order = order_for(deadline=datetime.now(UTC) + timedelta(seconds=30))
    assert refusal(signed(order), now=time.time() + 31).reason is OrderRefusal.EXPIRED


def test_an_order_of_another_version_is_refused() -> None:
    assert refusal(signed(order_for() | {"order_version": 1})).reason is OrderRefusal.UNSUPPORTED_VERSION


def test_an_order_whose_deadline_lies_far_after_its_approval_is_refused() -> None:
    far = datetime.now(UTC) + timedelta(seconds=MAX_ORDER_WINDOW_SECONDS + 60)
    assert refusal(signed(order_for(deadline=far))).reason is OrderRefusal.WINDOW_TOO_LONG


def test_an_agent_without_central_key_refuses_everything() -> None:
    with pytest.raises(OrderRefused) as refused:
        verify_order(signed(order_for()), central_key=None, host_name=HOST, now=time.time())
    assert refused.value.reason is OrderRefusal.NO_CENTRAL_KEY


def test_a_replayed_order_executes_nothing_more(
    processes: Processes, journal: Journal, signal_spy: SignalSpy
) -> None:
    trainer = processes.start("trainer.py")
    message = signed(make_order([target_for(trainer.pid)]))
    first = execute_order(verify(message), journal=journal, report=Reports())
    sent_first = list(signal_spy.sent)
    assert first["result"] == "succeeded" and sent_first

    again = execute_order(verify(message), journal=journal, report=Reports())  # the captured copy

    assert again["duplicate"] is True and signal_spy.sent == sent_first
