"""The snapshot checks at their edges: values exactly at a limit pass, one past it fails, and
a rejection keeps the host's name whatever made the payload unreadable."""

from __future__ import annotations

import json
import pickle
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from gpuadmin.fleet.intake import validation
from gpuadmin.fleet.intake.schema_types import NOT_VALID
from gpuadmin.fleet.intake.validation import (
    INT64_MAX,
    MAX_CLOCK_AHEAD,
    PID_MAX_LIMIT,
    SnapshotRejected,
    json_path,
    parse_snapshot,
    payload_size_bytes,
)
from gpuadmin.fleet.taken_at import parse_taken_at
from gpuadmin.text import human_bytes
from tests.factories import gpu, proc
from tests.fleet.helpers import NOW, good, rejection


def test_taken_at_exactly_the_allowed_margin_ahead_is_accepted() -> None:
    document = good(taken_at=NOW + MAX_CLOCK_AHEAD)
    assert parse_snapshot(json.dumps(document), now=NOW)["taken_at"] == document["taken_at"]


def test_the_largest_64_bit_integer_is_accepted_and_one_more_is_not() -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["rss_bytes"] = INT64_MAX
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["rss_bytes"] == INT64_MAX
    document["processes"][0]["rss_bytes"] = INT64_MAX + 1
    assert rejection(json.dumps(document)).message.endswith("is larger than a 64-bit integer")


@pytest.mark.parametrize("field", ["ppid", "pgid", "sid"])
def test_every_process_id_field_is_held_to_pid_max_limit(field: str) -> None:
    document = good(processes=[proc(10), proc(11, pgid=None), proc(12)])
    document["processes"][2][field] = PID_MAX_LIMIT + 1
    assert rejection(json.dumps(document)).message.startswith(
        f"processes[2].{field}: {PID_MAX_LIMIT + 1} is greater than Linux's PID_MAX_LIMIT"
    )


def test_a_uid_too_big_for_its_column_is_named_with_its_process() -> None:
    document = good(processes=[proc(10, uid=None), proc(11, uid=2**31)])
    assert rejection(json.dumps(document)).message == (
        "processes[1].uid: 2147483648 is greater than 2147483647 (2147483647)"
    )


def test_a_payload_that_is_not_utf8_keeps_the_host_name() -> None:
    payload = json.dumps(good()).encode()[:-20] + b"\xff\xfe"
    error = rejection(payload)
    assert "not UTF-8" in error.message
    assert error.host_name == "gpu07"


def test_a_payload_nested_too_deeply_keeps_the_host_name() -> None:
    text = json.dumps(good())
    payload = text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    error = rejection(payload)
    assert error.message == "snapshot is not valid JSON: nested too deeply"
    assert error.host_name == "gpu07"


@pytest.mark.usefixtures("host_in_another_time_zone")
def test_taken_at_is_read_as_utc_whatever_the_host_time_zone() -> None:
    assert parse_taken_at("2025-03-04T05:06:07.1234567Z").isoformat() == "2025-03-04T05:06:07.123456+00:00"
    assert parse_taken_at("2025-03-04T07:06:07+02:00") == parse_taken_at("2025-03-04T05:06:07Z")


@pytest.mark.parametrize(
    ("ahead", "said"),
    [
        (timedelta(days=3, hours=5), "3 days"),
        (timedelta(days=2), "2 days"),
        (timedelta(days=2) - timedelta(seconds=1), "47 hours"),
        (timedelta(hours=2), "2 hours"),
        (timedelta(hours=2) - timedelta(seconds=1), "119 minutes"),
    ],
)
def test_a_clock_ahead_is_said_in_the_largest_whole_unit(ahead: timedelta, said: str) -> None:
    document = good(taken_at=NOW + ahead)
    assert rejection(json.dumps(document)).message == (
        f"taken_at: {document['taken_at']} is {said} ahead of central's clock (at most 5 minutes allowed); "
        "fix the host's clock (NTP)"
    )


def put(document: dict[str, Any], path: str, value: int) -> dict[str, Any]:
    node: Any = document
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return document


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "host.pid_max", PID_MAX_LIMIT + 1,
            "host.pid_max: 4194305 is greater than Linux's PID_MAX_LIMIT (4194304)",
        ),
        ("host.pids_in_use", 2**31, "host.pids_in_use: 2147483648 is greater than 2147483647 (2147483647)"),
        ("process_counts.zombies", 2**31, "process_counts.zombies: 2147483648 is greater than 2147483647 "
                                          "(2147483647)"),
        ("gpus.0.index", 2**31, "gpus[0].index: 2147483648 is greater than 2147483647 (2147483647)"),
        ("processes.0.uid", 2**31, "processes[0].uid: 2147483648 is greater than 2147483647 (2147483647)"),
    ],
)
def test_a_number_the_database_cannot_hold_is_named_with_its_limit(
    path: str, value: int, message: str
) -> None:
    document = put(good(processes=[proc(10)], gpus=[gpu(0)]), path, value)
    assert rejection(json.dumps(document)).message == message


@pytest.mark.parametrize(("payload", "got"), [("true", "a boolean"), ("1.5", "a number")])
def test_a_payload_that_is_not_an_object_says_what_it_is(payload: str, got: str) -> None:
    error = rejection(payload)
    assert error.message == f"snapshot must be a JSON object, got {got}"
    assert error.host_name == ""


def test_an_oversized_payload_says_both_sizes_and_what_to_do() -> None:
    text = json.dumps(good())
    limit = len(text) // 2
    with override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=limit):
        assert rejection(text).message == (
            f"snapshot is {human_bytes(len(text))}, over the limit of {human_bytes(limit)} "
            "(GPUADMIN_SNAPSHOT_MAX_BYTES); run the probe without --all, or raise the limit"
        )


def test_a_payload_with_nan_keeps_the_host_name() -> None:
    text = json.dumps(good()).replace('"pid_max": ', '"pid_max": NaN, "was": ', 1)
    error = rejection(text)
    assert error.message.startswith("snapshot is not valid JSON: ")
    assert error.host_name == "gpu07"


@pytest.mark.parametrize(
    "host", ["gpu07", {"name": 7}, {"name": "bad name;rm"}], ids=["not-an-object", "not-text", "not-a-name"]
)
def test_a_rejection_without_a_readable_host_name_names_none(host: object) -> None:
    document = good()
    document["host"] = host
    error = rejection(json.dumps(document))
    assert error.host_name == ""


def test_a_gpu_listed_twice_names_both_entries() -> None:
    document = good(gpus=[gpu(0), gpu(1), gpu(2)])
    document["gpus"][2]["uuid"] = document["gpus"][1]["uuid"]
    uuid = json.dumps(document["gpus"][1]["uuid"])
    message = rejection(json.dumps(document)).message
    assert message == f"gpus[2].uuid: GPU {uuid} is listed twice (also gpus[1])"
    document = good(gpus=[gpu(0), gpu(1), gpu(2)])
    document["gpus"][2]["index"] = 1
    message = rejection(json.dumps(document)).message
    assert message == "gpus[2].index: GPU index 1 is listed twice (also gpus[1])"


def test_json_path_keeps_a_key_with_capitals_dotted() -> None:
    assert json_path(["host", "Name_2"]) == "host.Name_2"


def test_an_unmatched_process_on_an_unknown_gpu_is_named() -> None:
    document = good(unmatched=[{"pid": 99, "gpu_uuid": "GPU-ghost", "used_memory_bytes": 1}])
    assert rejection(json.dumps(document)).message == (
        'unmatched_gpu_processes[0].gpu_uuid: GPU "GPU-ghost" is not in gpus'
    )


# --- the walk over every string and number runs only when the text can hold what it refuses ---


def test_a_clean_snapshot_is_not_walked_value_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(*_args: object) -> None:
        raise AssertionError("walked a snapshot with nothing to find")

    monkeypatch.setattr(validation, "_check_strings_and_numbers", walked)
    document = good(processes=[proc(10, cmdline=["python", "caf\u00e9.py", "--lr=1e-4"],
                                    elapsed_seconds=1e6)])
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["cmdline"][1] == "caf\u00e9.py"


def test_raw_non_ascii_text_without_escapes_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(value: object, path: str) -> None:
        raise AssertionError("walked a snapshot with nothing to find")

    monkeypatch.setattr(validation, "_check_strings_and_numbers", walked)
    payload = json.dumps(good(processes=[proc(10, name="caf\u00e9", cmdline=["py"])]), ensure_ascii=False)
    assert not payload.isascii() and "\\u" not in payload
    assert parse_snapshot(payload, now=NOW)["processes"][0]["name"] == "caf\u00e9"


def test_a_raw_lone_surrogate_in_a_text_payload_is_refused() -> None:
    text = json.dumps(good(processes=[proc(10, name="py\ud800", cmdline=["py"])]), ensure_ascii=False)
    assert "\ud800" in text  # the character itself, not an escape
    assert rejection(text).message == (
        "processes[0].name: contains a lone UTF-16 surrogate, not valid Unicode text"
    )


def test_a_nul_in_a_key_is_refused_with_the_object_s_path() -> None:
    document = good(processes=[proc(10, gpu_memory={"GPU-sim-0000\x00": 1024})])
    message = rejection(json.dumps(document)).message
    assert message == "processes[0].gpu_memory_bytes: contains a NUL character"


def test_memory_that_adds_up_beyond_64_bits_on_one_gpu_is_refused() -> None:
    """Each figure fits, their sum (the GPU's attributed memory, a bigint column) would not."""
    half = 2**62
    document = good(processes=[proc(10, gpu_memory={"GPU-sim-0000": half}),
                               proc(11, gpu_memory={"GPU-sim-0000": half})])
    assert rejection(json.dumps(document)).message == (
        'processes: the memory they hold on GPU "GPU-sim-0000" adds up to more than a 64-bit integer'
    )


def test_one_process_s_memory_over_its_gpus_beyond_64_bits_is_refused() -> None:
    half = 2**62
    document = good(gpus=[gpu(0), gpu(1)],
                    processes=[proc(10, gpu_memory={"GPU-sim-0000": half, "GPU-sim-0001": half})])
    assert rejection(json.dumps(document)).message == (
        "processes[0].gpu_memory_bytes: adds up to more than a 64-bit integer"
    )


def test_a_float_beyond_64_bits_is_refused_where_it_is() -> None:
    document = good(processes=[proc(10, elapsed_seconds=1e19)])
    assert rejection(json.dumps(document)).message == (
        "processes[0].elapsed_seconds: 1e+19 is larger than a 64-bit integer"
    )


@pytest.mark.parametrize(
    "text",
    ["\U0001f600 emoji (a surrogate pair when escaped)", "a\\u0000b", "\\ud800 written out"],
    ids=["pair", "escaped-backslash-nul", "escaped-surrogate"],
)
def test_text_that_only_looks_suspect_is_walked_and_accepted(text: str) -> None:
    document = good(processes=[proc(10, cmdline=["python", text])])
    payload = json.dumps(document)
    assert validation._SUSPECT_TEXT.search(payload)
    assert parse_snapshot(payload, now=NOW)["processes"][0]["cmdline"][1] == text


def test_a_big_but_valid_integer_is_walked_and_accepted() -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["rss_bytes"] = 10**18 + 1  # 19 digits: looked at, and it fits
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["rss_bytes"] == 10**18 + 1


@pytest.mark.parametrize(("text", "suspect"), [
    ('{"cmdline": ["python", "train.py"]}', False),  # no backslash at all: one memchr says so
    ('{"cmdline": ["echo", "say \\"hi\\" \\\\ bye\\n"]}', False),  # escapes, none of them \u
    ('{"cmdline": ["a\\u0000b"]}', True),
    ('{"cmdline": ["\\ud800"]}', True),
    ('{"cmdline": ["\\u00e9t\\u00e9"]}', False),  # \u escapes, no NUL and no surrogate among them
    ('{"cmdline": ["\udc80"]}', True),  # a raw lone surrogate in a str payload
])
def test_only_text_that_may_hold_a_nul_or_a_lone_surrogate_is_walked(text: str, suspect: bool) -> None:
    assert validation._may_hold_suspect_text(text) is suspect


# --- the same edges on the slow path (what the quick msgspec check does not decide) --------------------


@pytest.fixture(params=["quick", "slow"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs twice: as usual, and with the quick check answering "not sure" to every text, as it
    does for a value its types do not know, so that the json + jsonschema + walk path decides alone."""
    if request.param == "slow":
        monkeypatch.setattr(validation, "quick_snapshot_decoder", lambda: lambda _text: NOT_VALID)
    return str(request.param)


def test_the_largest_64_bit_integer_passes_the_walk_too(path: str) -> None:
    document = good(processes=[proc(10)])
    document["processes"][0]["rss_bytes"] = INT64_MAX
    assert parse_snapshot(json.dumps(document), now=NOW)["processes"][0]["rss_bytes"] == INT64_MAX


def test_memory_adding_up_to_exactly_64_bits_per_process_and_per_gpu_is_accepted(path: str) -> None:
    # All of it together is over 64 bits, so each process and each GPU is added up on its own.
    document = good(gpus=[gpu(0), gpu(1)], processes=[proc(10), proc(11)])
    uuids = [entry["uuid"] for entry in document["gpus"]]
    document["processes"][0]["gpu_memory_bytes"] = {uuids[0]: INT64_MAX}
    document["processes"][1]["gpu_memory_bytes"] = {uuids[1]: 1}
    parsed = parse_snapshot(json.dumps(document), now=NOW)
    assert parsed["processes"][0]["gpu_memory_bytes"] == {uuids[0]: INT64_MAX}


def test_memory_of_one_gpu_adding_up_past_64_bits_is_named(path: str) -> None:
    document = good(gpus=[gpu(0)], processes=[proc(10), proc(11)])
    uuid = document["gpus"][0]["uuid"]
    document["processes"][0]["gpu_memory_bytes"] = {uuid: INT64_MAX}
    document["processes"][1]["gpu_memory_bytes"] = {uuid: 1}
    assert rejection(json.dumps(document)).message == (
        f"processes: the memory they hold on GPU {json.dumps(uuid)} adds up to more than a 64-bit integer"
    )


def test_a_snapshot_too_old_says_how_old_and_what_to_fix(settings: Any) -> None:
    settings.GPUADMIN_HISTORY_DAYS = 90
    message = rejection(json.dumps(good(taken_at=NOW - timedelta(days=91)))).message
    assert " is 91 days before central's clock, older than anything central keeps " in message
    assert message.endswith("(GPUADMIN_HISTORY_DAYS = 90); fix the host's clock (NTP)")


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(119, "119 seconds"), (120, "2 minutes"), (2 * 3600 - 1, "119 minutes"), (2 * 3600, "2 hours"),
     (2 * 86400 - 1, "47 hours"), (2 * 86400, "2 days")],
)
def test_durations_in_messages_switch_unit_at_two_of_the_next(seconds: int, words: str) -> None:
    assert validation._duration(timedelta(seconds=seconds)) == words


def test_a_text_payload_is_measured_in_utf8_bytes_at_the_limit(settings: Any) -> None:
    settings.GPUADMIN_SNAPSHOT_MAX_BYTES = 1000
    assert payload_size_bytes("é" * 1000) == 2000
    assert payload_size_bytes("é" * 999) == 1998
    assert payload_size_bytes("e" * 1000) == 1000
    assert payload_size_bytes(b"\xc3\xa9" * 10) == 20
    assert payload_size_bytes(None) == 0  # type: ignore[arg-type]


def test_a_rejection_keeps_its_message_when_sent_between_processes() -> None:
    # Celery carries an exception by its args: the message must be one of them.
    rejected = SnapshotRejected("snapshot is not valid JSON", host_name="gpu07")
    assert pickle.loads(pickle.dumps(rejected)).message == "snapshot is not valid JSON"
    assert rejected.args == ("snapshot is not valid JSON",)


def test_the_schema_is_read_afresh_each_time() -> None:
    first, second = validation.snapshot_schema(), validation.snapshot_schema()
    assert first == second and first is not second
    assert tuple(first["properties"]["schema_version"]["enum"]) == validation.supported_schema_versions()
