"""What a refused order tells the people who read the agent's report.

An order refused before it runs is reported back to central as an ``order_refused`` event: its reason,
a sentence for the lab admin, the request id the message claims and the SHA-256 of the signed text, so
that the admin can find which request (and which exact text) was refused. These tests pin each of
those, and the boundaries of the checks (tests/probe/kill/test_signed_orders.py has the refusals
themselves, tests/probe/kill/test_order_validation.py the order's fields).
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from gpuadmin.wire.kill_order import (
    MAX_ORDER_TEXT_CHARS,
    Order,
    OrderRefused,
    validate_order,
    verify_order,
)
from gpuadmin.wire.kill_protocol import (
    ACCEPTED_ORDER_VERSIONS,
    MAX_HOST_CLOCK_OFFSET_SECONDS,
    MAX_ORDER_WINDOW_SECONDS,
    MAX_SELF_SERVICE_UIDS,
    REAP_SIGNAL,
    SELF_SERVICE_ORDER_VERSION,
    OrderRefusal,
)
from gpuadmin.wire.signing import MessageKind, generate_private_key, public_key_text, seal, seal_text
from tests.probe.kill.helpers import good_order

CENTRAL = generate_private_key()
CENTRAL_PUBLIC = public_key_text(CENTRAL)
HOST = "gpu01"


def _order(**changes: object) -> dict:
    """good_order() for this host, approved now, with two minutes to start."""
    now = datetime.now(UTC).replace(microsecond=0)
    order = good_order() | {"host": HOST, "approved_at": _iso(now),
                            "deadline": _iso(now + timedelta(minutes=2))}
    order.update(changes)
    return order


def _refusal(message: object, *, now: float | None = None, key: str | None = CENTRAL_PUBLIC) -> OrderRefused:
    with pytest.raises(OrderRefused) as refused:
        verify_order(message, central_key=key, host_name=HOST, now=time.time() if now is None else now)
    return refused.value


def _sha256(message: dict) -> str:
    return hashlib.sha256(message["text"].encode("ascii")).hexdigest()


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


# --- the refusal as reported --------------------------------------------------------------------------


def test_a_refusal_reads_as_its_reason_then_its_detail() -> None:
    refused = OrderRefused(OrderRefusal.WRONG_HOST, "for gpu02", request_id="17", order_sha256="ab" * 32)
    assert str(refused) == f"{OrderRefusal.WRONG_HOST.value}: for gpu02"
    assert (refused.request_id, refused.order_sha256) == ("17", "ab" * 32)


def test_an_agent_without_central_key_says_which_setting_is_missing() -> None:
    refused = _refusal(seal(_order(), MessageKind.ORDER, CENTRAL), key=None)
    assert refused.reason is OrderRefusal.NO_CENTRAL_KEY
    assert refused.detail == ("this agent has no central public key (GPUADMIN_CENTRAL_PUBLIC_KEY) "
                              "to verify orders with")
    assert refused.request_id == "42"


def test_an_unsigned_order_is_refused_with_the_rule_it_broke() -> None:
    refused = _refusal(_order(request_id="r-9"))
    assert refused.reason is OrderRefusal.UNSIGNED
    assert refused.detail == "not a signed order; central signs every order"
    assert refused.request_id == "r-9"


def test_a_forged_signature_reports_the_request_id_the_text_claims() -> None:
    refused = _refusal(seal(_order(request_id="r-10"), MessageKind.ORDER, generate_private_key()))
    assert refused.reason is OrderRefusal.BAD_SIGNATURE and refused.request_id == "r-10"


def test_an_oversized_signed_text_is_refused_before_it_is_parsed() -> None:
    text = json.dumps(_order())
    message = seal_text(text[:-1] + " " * MAX_ORDER_TEXT_CHARS + "}", MessageKind.ORDER, CENTRAL)
    refused = _refusal(message)
    assert refused.reason is OrderRefusal.BAD_SIGNATURE
    assert f"over the limit of {MAX_ORDER_TEXT_CHARS}" in refused.detail


@pytest.mark.parametrize(
    ("change", "reason", "words"),
    [
        ({"order_version": 999}, OrderRefusal.UNSUPPORTED_VERSION, "order_version 999; this agent runs"),
        ({"host": "gpu02"}, OrderRefusal.WRONG_HOST, "the order is for host 'gpu02', this is 'gpu01'"),
        ({"plan": []}, OrderRefusal.MALFORMED, "'plan' must be a non-empty list of steps"),
    ],
)
def test_each_refusal_after_the_signature_names_the_request_and_the_exact_text(
    change: dict, reason: OrderRefusal, words: str
) -> None:
    message = seal(_order(request_id="r-11", **change), MessageKind.ORDER, CENTRAL)
    refused = _refusal(message)
    assert refused.reason is reason
    assert words in refused.detail
    assert refused.request_id == "r-11"
    assert refused.order_sha256 == _sha256(message)


def test_an_unsupported_version_lists_every_version_this_agent_runs() -> None:
    refused = _refusal(seal(_order(order_version=999), MessageKind.ORDER, CENTRAL))
    accepted = ", ".join(str(v) for v in sorted(ACCEPTED_ORDER_VERSIONS))
    assert refused.detail == f"order_version 999; this agent runs version {accepted} only"
    with pytest.raises(ValueError, match=f"this agent runs version {accepted} only"):
        validate_order(_order(order_version=999))


def test_a_signed_text_that_is_not_json_is_malformed_and_claims_no_request() -> None:
    message = seal_text('{"request_id": "r-12", not json', MessageKind.ORDER, CENTRAL)
    refused = _refusal(message)
    assert refused.reason is OrderRefusal.MALFORMED
    assert refused.detail.startswith("the signed text is not JSON: ")
    assert refused.request_id is None
    assert refused.order_sha256 == _sha256(message)


def test_a_signed_json_text_that_is_not_an_object_has_no_version() -> None:
    message = seal_text(json.dumps(["order_version", 2]), MessageKind.ORDER, CENTRAL)
    refused = _refusal(message)
    assert refused.reason is OrderRefusal.UNSUPPORTED_VERSION
    assert refused.detail.startswith("order_version None; ")


def test_an_expired_order_names_both_times_on_this_hosts_clock() -> None:
    deadline = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    order = _order(deadline=_iso(deadline), approved_at=_iso(deadline - timedelta(minutes=1)))
    message = seal(order, MessageKind.ORDER, CENTRAL)
    refused = _refusal(message, now=deadline.timestamp() + 5)
    assert refused.reason is OrderRefusal.EXPIRED
    assert refused.detail == ("received at 2026-12-04T12:00:05+00:00 (this host's clock), after its deadline "
                              "2026-12-04T12:00:00+00:00 (on this host's clock)")
    assert refused.order_sha256 == _sha256(message)


def test_an_order_is_still_in_time_at_its_deadline_to_the_second() -> None:
    deadline = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    order = _order(deadline=_iso(deadline), approved_at=_iso(deadline - timedelta(minutes=1)))
    parsed = validate_order(order)
    assert not parsed.expired_at(deadline.timestamp())
    assert parsed.expired_at(deadline.timestamp() + 0.001)
    assert verify_order(seal(order, MessageKind.ORDER, CENTRAL), central_key=CENTRAL_PUBLIC,
                        host_name=HOST, now=deadline.timestamp()) == order


def test_a_window_too_long_says_how_long_it_is_and_the_limit() -> None:
    approved = datetime.now(UTC)
    order = _order(approved_at=_iso(approved),
                   deadline=_iso(approved + timedelta(seconds=MAX_ORDER_WINDOW_SECONDS + 60)))
    refused = _refusal(seal(order, MessageKind.ORDER, CENTRAL))
    assert refused.reason is OrderRefusal.WINDOW_TOO_LONG
    assert refused.detail == (f"its deadline is {MAX_ORDER_WINDOW_SECONDS + 60} s after its approval; "
                              f"an agent accepts at most {MAX_ORDER_WINDOW_SECONDS} s")


def test_a_window_of_exactly_the_limit_is_accepted() -> None:
    approved = datetime.now(UTC).replace(microsecond=0)
    order = _order(approved_at=_iso(approved),
                   deadline=_iso(approved + timedelta(seconds=MAX_ORDER_WINDOW_SECONDS)))
    assert verify_order(seal(order, MessageKind.ORDER, CENTRAL), central_key=CENTRAL_PUBLIC,
                        host_name=HOST, now=approved.timestamp()) == order


# --- the request id a message claims (reported, never trusted) ---------------------------------------


@pytest.mark.parametrize(
    ("request_id", "reported"),
    [(42, "42"), ("r" * 200, "r" * 128), (True, None), (None, None), (4.5, None), (["x"], None)],
)
def test_the_claimed_request_id_is_a_short_text_or_nothing(request_id: object, reported: str | None) -> None:
    refused = _refusal(seal(_order(request_id=request_id), MessageKind.ORDER, generate_private_key()))
    assert refused.request_id == reported


def test_an_unsigned_dict_claims_its_own_request_id() -> None:
    assert _refusal({"request_id": "plain-1"}).request_id == "plain-1"
    assert _refusal({"text": "{broken", "sig": "x"}).request_id is None


# --- the order's own fields ---------------------------------------------------------------------------


def test_a_parsed_order_keeps_its_version_and_a_kill_has_no_gpu() -> None:
    parsed = validate_order(_order())
    assert isinstance(parsed, Order)
    assert parsed.order_version == good_order()["order_version"]
    assert parsed.gpu_uuid == ""
    assert parsed.plan and parsed.targets


def test_a_host_deadline_exactly_at_the_largest_offset_is_accepted_and_beyond_it_refused() -> None:
    deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)
    at_limit = deadline + timedelta(seconds=MAX_HOST_CLOCK_OFFSET_SECONDS)
    parsed = validate_order(_order(deadline=_iso(deadline), host_deadline=_iso(at_limit)))
    assert parsed.host_deadline == at_limit
    beyond = at_limit + timedelta(seconds=1)
    with pytest.raises(ValueError) as error:
        validate_order(_order(deadline=_iso(deadline), host_deadline=_iso(beyond)))
    assert str(error.value) == (f"order: 'host_deadline' is more than {MAX_HOST_CLOCK_OFFSET_SECONDS} s away "
                                "from 'deadline'; no clock offset that large is corrected")


def test_a_naive_host_deadline_is_refused_with_the_field_named() -> None:
    with pytest.raises(ValueError) as error:
        validate_order(_order(host_deadline="2026-12-04T12:00:00"))
    assert str(error.value) == ("order: 'host_deadline' must carry a UTC offset (e.g. 'Z'): "
                                "'2026-12-04T12:00:00'")


@pytest.mark.parametrize("plan_length", [2, 3])
def test_a_reap_step_must_be_the_only_step(plan_length: int) -> None:
    steps = [{"signal": "SIGINT", "grace_seconds": 1}] * (plan_length - 1) + [
        {"signal": REAP_SIGNAL, "grace_seconds": 1}
    ]
    with pytest.raises(ValueError) as error:
        validate_order(_order(plan=steps))
    assert str(error.value) == (f"{REAP_SIGNAL} asks a parent to reap its zombies: "
                                "it must be the plan's only step")


def test_a_reap_plan_of_one_step_is_an_order() -> None:
    parsed = validate_order(_order(plan=[{"signal": REAP_SIGNAL, "grace_seconds": 1}]))
    assert parsed.asks_to_reap


# --- a self-service order's block (tests/probe/kill/test_self_service_orders.py runs them) ------------


def _self_service(allowed_uids: object, **block: object) -> dict:
    return _order(order_version=SELF_SERVICE_ORDER_VERSION,
                  self_service={"allowed_uids": allowed_uids, "person": "alice", **block})


def _refused_with(order: dict) -> str:
    with pytest.raises(ValueError) as error:
        validate_order(order)
    return str(error.value)


def test_a_self_service_order_keeps_its_uids_and_its_person() -> None:
    parsed = validate_order(_self_service([1000, 0]))  # good_order's target runs as 1000
    assert parsed.self_service_uids == frozenset({0, 1000})
    assert parsed.self_service_person == "alice"
    assert parsed.order_version == SELF_SERVICE_ORDER_VERSION


def test_as_many_uids_as_allowed_pass_and_one_more_does_not() -> None:
    most = [1000, *range(MAX_SELF_SERVICE_UIDS - 1)]
    assert len(validate_order(_self_service(most)).self_service_uids or ()) == MAX_SELF_SERVICE_UIDS
    assert _refused_with(_self_service([*most, 99_999])) == (
        f"order.self_service: 'allowed_uids' must be a list of 1 to {MAX_SELF_SERVICE_UIDS} uids")


@pytest.mark.parametrize("uids", [[1000, -1], [1000, True], [1000, "0"]])
def test_allowed_uids_are_non_negative_integers(uids: list) -> None:
    assert _refused_with(_self_service(uids)) == (
        f"order.self_service: 'allowed_uids' must hold non-negative integers; got {uids!r}")


def test_the_block_must_be_an_object_and_name_a_person() -> None:
    assert _refused_with(_order(order_version=SELF_SERVICE_ORDER_VERSION, self_service=[1000])) == (
        "order.self_service must be an object like {'allowed_uids': [1000], 'person': 'alice'}")
    assert _refused_with(_self_service([1000], person=" ")) == (
        "order.self_service: 'person' must not be empty")
    missing = _order(order_version=SELF_SERVICE_ORDER_VERSION, self_service={"person": "alice"})
    assert _refused_with(missing) == "order.self_service: missing 'allowed_uids'"


def test_a_target_outside_the_allowed_uids_is_named_with_them_sorted() -> None:
    assert _refused_with(_self_service([2000, 1001])) == (
        "order.self_service: target PID 4120 has uid 1000, not one of the allowed uids [1001, 2000]")


def test_only_a_kill_may_be_self_service() -> None:
    reset = _self_service([1000]) | {"action": "reset_gpu", "gpu": {"uuid": "GPU-0"},
                                     "targets": [], "plan": []}
    assert _refused_with(reset) == (
        "order.self_service: only a kill may be self-service; got action 'reset_gpu'")


def test_a_version_3_order_must_carry_its_block() -> None:
    order = _self_service([1000])
    del order["self_service"]
    assert _refused_with(order) == (
        f"order: version {SELF_SERVICE_ORDER_VERSION} is a self-service order; its 'self_service' is missing")


def test_allowed_uids_that_are_not_a_list_are_refused_as_such() -> None:
    assert _refused_with(_self_service("1000")) == (
        f"order.self_service: 'allowed_uids' must be a list of 1 to {MAX_SELF_SERVICE_UIDS} uids")


def test_an_order_without_the_block_has_no_uids_and_no_person() -> None:
    parsed = validate_order(_order())
    assert (parsed.self_service_uids, parsed.self_service_person) == (None, "")


def test_a_wrong_host_is_named_within_a_host_names_length() -> None:
    refused = _refusal(seal(_order(host="h" * 300), MessageKind.ORDER, CENTRAL))
    assert refused.detail == f"the order is for host {'h' * 253!r}, this is 'gpu01'"
