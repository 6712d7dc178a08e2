"""The quick schema check (fleet/intake/schema_types.py, validation.quick_snapshot_decoder) is never more
lenient than jsonschema: whatever JSON text it accepts, jsonschema accepts. It may refuse a valid
document; the full check then has the word, so such a document is still stored."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import msgspec
import pytest

from gpuadmin.fleet.intake import schema_types
from gpuadmin.fleet.intake.schema_types import Unsupported, python_pattern
from gpuadmin.fleet.intake.validation import (
    INT64_MAX,
    SnapshotRejected,
    parse_snapshot,
    quick_snapshot_decoder,
    snapshot_schema,
    snapshot_validator,
)
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner, snapshot
from tests.fleet.intake.test_validation_fast import good, jsonschema_accepts

SCHEMA = snapshot_schema()
PROCESS_PROPERTIES = sorted(SCHEMA["$defs"]["process"]["properties"])
OWNER_PROPERTIES = sorted(SCHEMA["$defs"]["owner"]["properties"])
GPU_PROPERTIES = sorted(SCHEMA["properties"]["gpus"]["items"]["properties"])
HOST_PROPERTIES = sorted(SCHEMA["properties"]["host"]["properties"])
# Values of every JSON type, at and past the edges the schema draws.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 0.5, -0.5, 100, 101, 2**32, 2**63 - 1, 2**63, -(2**63), 1e300, "", "x",
    "A", "AB", "a\n", "0" * 64, "g" * 64, "x" * 129, "x" * 257, "x" * 4097, "x" * 8193, [], ["x"], [1],
    ["gpu", "gpu"], ["gpu", "zombie"], [1, 1], ["x" * 8193], {}, {"a": 1}, {"a": -1}, {"a": 1.0},
    {"a": None}, {"kind": "slurm_job"}, {"kind": "vm"}, {str(n): 0 for n in range(257)},
]


def valid_json_check(schema: dict[str, Any]) -> Any:
    """``text -> bool``: whether the decoder validation would build for ``schema`` vouches for the text
    (numbers held to 64 bits)."""
    decode = schema_types.checked_json_decoder(schema, largest_number=INT64_MAX)
    return lambda text: decode(text) is not schema_types.NOT_VALID


def quick_snapshot_check() -> Any:
    """``text -> bool``: whether validation's quick decoder vouches for the snapshot text."""
    return lambda text: quick_snapshot_decoder()(text) is not schema_types.NOT_VALID


def quick_accepts(document: dict[str, Any]) -> bool:
    return quick_snapshot_check()(json.dumps(document))


def test_a_usual_snapshot_is_accepted_quickly_as_text_or_bytes():
    text = json.dumps(good())
    assert quick_snapshot_check()(text)
    assert quick_snapshot_check()(text.encode())
    assert parse_snapshot(text.encode()) == json.loads(text)


def test_what_the_quick_check_vouches_for_comes_back_as_a_plain_decode_gives_it():
    # parse_snapshot's only decode of a usual snapshot: it must equal what msgspec.json.decode gives,
    # down to the type of each value (an integer in a "number" field stays an int, not 60.0).
    document = good()
    document["probe_duration_seconds"] = 3
    document["processes"][0]["elapsed_seconds"] = 60
    document["processes"][1]["elapsed_seconds"] = 0.5
    assert "exe" not in document["processes"][1]  # optional, and absent: absent it stays
    text = json.dumps(document)
    decoded = quick_snapshot_decoder()(text)
    assert decoded is not schema_types.NOT_VALID
    assert decoded == msgspec.json.decode(text) == document
    assert json.dumps(decoded, sort_keys=True) == json.dumps(document, sort_keys=True)  # types too
    assert type(decoded["probe_duration_seconds"]) is int
    assert type(decoded["processes"][1]["elapsed_seconds"]) is float
    assert "exe" not in decoded["processes"][1]
    assert quick_snapshot_decoder()(text.replace('"processes"', '"processes!"', 1)) is schema_types.NOT_VALID


@pytest.mark.parametrize("name", PROCESS_PROPERTIES)
def test_no_value_of_a_process_property_gets_through_that_jsonschema_refuses(name):
    let_through = []
    for value in ODD_VALUES:
        document = good()
        document["processes"][0][name] = value
        if quick_accepts(document) and not jsonschema_accepts(document):
            let_through.append(value)
    assert let_through == []


@pytest.mark.parametrize("name", OWNER_PROPERTIES)
def test_no_value_of_an_owner_property_gets_through_that_jsonschema_refuses(name):
    let_through = []
    for value in ODD_VALUES:
        document = good()
        document["processes"][0]["owner"][name] = value
        if quick_accepts(document) and not jsonschema_accepts(document):
            let_through.append(value)
    assert let_through == []


@pytest.mark.parametrize(("where", "name"), [("gpus", n) for n in GPU_PROPERTIES]
                         + [("host", n) for n in HOST_PROPERTIES])
def test_no_value_of_a_gpu_or_host_property_gets_through_that_jsonschema_refuses(where, name):
    let_through = []
    for value in ODD_VALUES:
        document = good()
        target = document["gpus"][0] if where == "gpus" else document["host"]
        target[name] = value
        if quick_accepts(document) and not jsonschema_accepts(document):
            let_through.append(value)
    assert let_through == []


def test_values_the_schema_allows_are_accepted_quickly():
    # The usual range of each kind of field, so that the quick check is not merely strict.
    document = good()
    document["processes"][0].update(uid=None, user=None, rss_bytes=None, pgid=None, elapsed_seconds=12,
                                    reasons=["gpu", "device"], exe=None)
    document["gpus"][0].update(utilization_percent=100, memory_used_bytes=None)
    document["host"].update(kernel=None, agent_pid=None)
    document["left_out"] = {"processes": 3, "by_reason": {"ancestor": 3}, "cmdlines_shortened": 0,
                            "max_bytes": 1000}
    assert jsonschema_accepts(document)
    assert quick_accepts(document)


def test_a_missing_required_property_or_an_unknown_one_is_refused():
    for mutate in (lambda p: p.pop("cmdline_sha256"), lambda p: p.update(surprise=1)):
        document = good()
        mutate(document["processes"][1])
        assert not quick_accepts(document) and not jsonschema_accepts(document)


def test_version_2_needs_owners_and_an_older_version_is_checked_quickly_by_its_own_types():
    document = good()
    del document["processes"][1]["owner"]
    assert not quick_accepts(document) and not jsonschema_accepts(document)
    document["schema_version"] = 1
    assert jsonschema_accepts(document)
    assert quick_accepts(document), "an older agent's snapshots would all take the full check (~30 ms)"
    assert parse_snapshot(json.dumps(document))["schema_version"] == 1


def test_for_property_value_leaves_out_an_if_on_another_value_only():
    schema = {"properties": {"v": {"enum": [1, 2]}}, "if": {"properties": {"v": {"const": 2}}},
              "then": {"required": ["owner"]}}
    assert schema_types.for_property_value(schema, "v", 1) == {"properties": {"v": {"const": 1}}}
    assert schema_types.for_property_value(schema, "v", 2) == {**schema, "properties": {"v": {"const": 2}}}
    with_else = {**schema, "else": {"required": ["x"]}}
    assert schema_types.for_property_value(with_else, "v", 1)["else"] == {"required": ["x"]}
    assert "if" in schema_types.for_property_value(with_else, "v", 1)
    assert schema["properties"]["v"] == {"enum": [1, 2]}, "the schema given is left as it is"


def test_numbers_beyond_64_bits_and_repeated_reasons_are_refused_quickly_and_named_by_the_full_check():
    document = good()
    document["processes"][0]["rss_bytes"] = 2**64
    assert jsonschema_accepts(document) and not quick_accepts(document)
    with pytest.raises(SnapshotRejected, match=r"processes\[0\]\.rss_bytes: .* larger than a 64-bit integer"):
        parse_snapshot(json.dumps(document))
    document = good()
    document["processes"][0]["reasons"] = ["gpu", "gpu"]
    assert not quick_accepts(document)
    with pytest.raises(SnapshotRejected, match=r"processes\[0\]\.reasons"):
        parse_snapshot(json.dumps(document))


def test_text_that_is_no_json_or_no_utf8_is_refused_quickly_and_named_by_the_full_check():
    text = json.dumps(good())
    for bad, reason in [(text[:-1], "not valid JSON"), (text.encode().replace(b'"python"', b'"\xff"', 1),
                                                        "not UTF-8"),
                        (text.replace('"python"', '"\\ud800"', 1), "lone UTF-16 surrogate"),
                        (text.replace('"python"', '"a\\u0000"', 1), "NUL")]:
        assert not quick_snapshot_check()(bad) or reason == "NUL", reason
        with pytest.raises(SnapshotRejected, match=reason):
            parse_snapshot(bad)


def test_mig_instances_and_owners_of_every_kind_are_checked_to_their_bounds():
    instance = {"gpu_uuid": "GPU-sim-0000", "gpu_instance_id": 1, "compute_instance_id": 0,
                "used_memory_bytes": GiB}
    mig = proc(12, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"], mig_instances=[instance])
    container = proc(13, owner=container_owner("a" * 64))
    document = snapshot("gpu01", processes=[mig, container], gpus=[gpu(0, used=2 * GiB)])
    assert quick_accepts(document) and jsonschema_accepts(document)
    assert parse_snapshot(json.dumps(document))["processes"][0]["mig_instances"][0]["gpu_instance_id"] == 1
    for name, value in [("gpu_instance_id", 2**32), ("compute_instance_id", -1), ("used_memory_bytes", 1.5),
                        ("gpu_uuid", "x" * 129), ("surprise", 1)]:
        bad = copy.deepcopy(document)
        bad["processes"][0]["mig_instances"][0][name] = value
        assert not quick_accepts(bad) and not jsonschema_accepts(bad), name
    bad = copy.deepcopy(document)
    bad["processes"][1]["owner"]["container_id"] = "A" * 64  # the pattern is lower-case hex
    assert not quick_accepts(bad) and not jsonschema_accepts(bad)


def test_an_invalid_process_is_still_named_by_the_full_check():
    document = snapshot("gpu01", processes=[proc(10, owner=slurm_owner()), proc(11, state="ZZ")])
    with pytest.raises(SnapshotRejected, match=r"processes\[1\]\.state"):
        parse_snapshot(json.dumps(document))


@pytest.mark.parametrize("schema", [
    {"type": "string", "minimum": 1},
    {"type": "integer", "multipleOf": 2},
    {"type": ["integer", "string"]},
    {"$ref": "#/$defs/missing"},
    {"$ref": "#/$defs/item", "type": "object"},
    {"anyOf": [{"type": "null"}], "type": "object"},
    {"enum": [1.5]},
    {"type": "object", "properties": {}, "additionalProperties": True},
    {"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False},
    {"type": "array", "minItems": 1},
    {"type": "object", "properties": {"v": {}}, "additionalProperties": False,
     "if": {"properties": {"v": {"const": 2}}}, "then": {}, "else": {}},
    {"allOf": [{}]},
    {},
    {"type": "array"},
    {"type": "object", "maxProperties": 3},
])
def test_a_schema_it_cannot_express_exactly_or_more_strictly_is_refused_when_built(schema):
    with pytest.raises(Unsupported):
        valid_json_check({**schema, "$defs": {"item": {"type": "string"}}})


def test_a_format_is_not_checked_as_jsonschema_does_not_and_integers_are_strict():
    dated = valid_json_check({"type": "string", "format": "date-time"})
    assert dated('"not a date"')
    counted = valid_json_check({"type": "integer", "minimum": 0})
    assert counted("0") and not counted("true") and not counted("1.0") and not counted("-1")
    chosen = valid_json_check({"enum": [1, None]})
    assert chosen("1") and chosen("null") and not chosen("true") and not chosen("1.0")
    unique = valid_json_check({"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True})
    assert unique('["a", "b"]') and not unique('["a", "a"]')
    assert not unique('["a", null]'), "unique nulls, numbers of two types...: the full check's to judge"


# Patterns of one character class repeated: checked as a length and the characters, all the strings
# of an array at once (schema_types._Characters). Values around each pattern's edges.
CLASS_PATTERNS = ["^[a-c]$", "^[a-c]{2}$", "^[a-c]{2,3}$", "^[a-c]{2,}$", "^[a-c]+$", "^[a-c]*$",
                  "^[^a-c]{2}$"]
CLASS_VALUES = ["", "a", "d", "ab", "aB", "a\n", "ab\n", "abc", "abd", "abca", "xy", "é", "ab" * 40]


@pytest.mark.parametrize("pattern", CLASS_PATTERNS)
@pytest.mark.parametrize("where", ["alone", "array", "array of objects", "nullable", "optional"])
def test_a_character_class_pattern_accepts_exactly_what_jsonschema_does_wherever_it_stands(pattern, where):
    string = {"type": ["string", "null"] if where == "nullable" else "string", "pattern": pattern}
    schema: dict[str, Any] = {
        "alone": string,
        "array": {"type": "array", "items": string},
    }.get(where) or {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "v": string},
        "required": ["id"] if where == "optional" else ["id", "v"], "additionalProperties": False}}
    quick = valid_json_check(schema)
    # Each value between two that the pattern takes: every item is checked, not only the first.
    fine = next(v for v in ["ab", "a", "xy"] if ecma_validator(string).is_valid(v))

    def document(value: Any) -> Any:
        if where == "alone":
            return value
        if where == "array":
            return [fine, value, fine]
        return [{"id": 1, "v": fine}, {"id": 2, "v": value}, {"id": 3, "v": fine}]

    differ = []
    for value in [*CLASS_VALUES, *([None] if where == "nullable" else [])]:
        # Exactly as lenient as JSON Schema's meaning ("ab\n" is no match of ^[a-c]{2}$), wherever it stands.
        valid = ecma_validator(schema).is_valid(document(value))
        if quick(json.dumps(document(value))) != valid:
            differ.append(value)
    if where == "optional":
        assert quick(json.dumps([{"id": 1}]))
    assert differ == []


def ecma_validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    """jsonschema as validation's full check extends it: its patterns mean what ECMA-262 means. Plain
    jsonschema searches with Python's re, whose "$" also matches before a final newline ("ab\\n" for
    ^[a-c]{2}$), so it is no measure of what JSON Schema allows there."""
    return type(snapshot_validator())(schema)


def schema_patterns(schema: Any) -> set[str]:
    if isinstance(schema, list):
        return set().union(*map(schema_patterns, schema))
    if not isinstance(schema, dict):
        return set()
    found = {schema["pattern"]} if isinstance(schema.get("pattern"), str) else set()
    return found.union(*map(schema_patterns, schema.values()))


SCHEMA_PATTERNS = sorted(schema_patterns(SCHEMA))
# Values each pattern of the snapshot schema takes, and around them.
PATTERN_VALUES = ["gpu01", "gpu-07.lab.example", "S", "z", "0" * 64, "0123456789abcdef" * 4,
                  "2026-12-01T00:00:00Z", "2026-12-01T00:00:00.123Z", "", "-gpu", "gpu 01", "SS"]


def ecma_means(pattern: str, value: str) -> bool:
    """What ``^…$`` means in ECMA-262: the whole text matches what is between the anchors."""
    assert pattern.startswith("^") and pattern.endswith("$") and "|" not in pattern, pattern
    return re.fullmatch(pattern[1:-1], value) is not None


def test_the_snapshot_schema_has_patterns_to_check():
    assert len(SCHEMA_PATTERNS) >= 4, SCHEMA_PATTERNS  # host name, taken_at, state, digests


@pytest.mark.parametrize("pattern", SCHEMA_PATTERNS)
@pytest.mark.parametrize("where", ["alone", "array", "nullable"])
def test_every_schema_pattern_means_in_each_check_what_it_means_in_json_schema(pattern, where):
    string = {"type": ["string", "null"] if where == "nullable" else "string", "pattern": pattern}
    schema = {"type": "array", "items": string} if where == "array" else string
    quick, full = valid_json_check(schema), ecma_validator(schema)
    values = [v + end for v in PATTERN_VALUES for end in ("", "\n", "\n\n", "\r", " ")]
    assert any(ecma_means(pattern, v) for v in values), "no value the pattern takes"
    differ = []
    for value in values:
        means = ecma_means(pattern, value)
        document = [value] if where == "array" else value
        answers = (quick(json.dumps(document)), full.is_valid(document))
        if answers != (means, means):
            differ.append((value, answers))
    assert differ == []


def test_python_pattern_rewrites_only_the_anchors():
    assert python_pattern("^[a-z]+$") == "^[a-z]+\\Z"
    assert python_pattern("^a$|^b$") == "^a\\Z|^b\\Z"
    assert python_pattern("^\\$[$]$") == "^\\$[$]\\Z"  # an escaped "$" and one in a class are dollars
    assert python_pattern("^[]$]$") == "^[]$]\\Z"  # a "]" first in a class is a member (Python's reading)
    assert python_pattern("^[^]$]$") == "^[^]$]\\Z"


def test_a_process_with_a_state_or_digest_out_of_its_class_or_repeated_reasons_is_refused_among_good_ones():
    for name, value in [("state", "1"), ("state", "é"), ("cmdline_sha256", "A" * 64),
                        ("cmdline_sha256", "0" * 63 + "g"), ("reasons", ["gpu", "zombie", "gpu"])]:
        document = good()
        document["processes"][1][name] = value  # the second of two: not only the first is looked at
        assert jsonschema_accepts(good()) and not jsonschema_accepts(document)
        assert not quick_accepts(document), (name, value)


def test_other_patterns_stay_with_msgspec():
    alternatives = valid_json_check({"type": "string", "pattern": "^(ab|cd)$"})
    assert alternatives('"cd"') and not alternatives('"ac"')
    escaped = valid_json_check({"type": "array", "items": {"type": "string", "pattern": "^[\\w]{2}$"}})
    assert escaped('["a_"]') and not escaped('["a-"]')


# uniqueItems over items of each kind of type, checked for all the arrays of an array of objects at once
# (schema_types._Unique). Values that JSON's equality and Python's disagree on among them.
UNIQUE_ITEMS = [{"enum": ["a", "b", 1, None]}, {"type": "string"}, {"type": "integer"},
                {"type": ["string", "null"]}, {"type": "number"}, {"type": "boolean"},
                {"type": "array", "items": {"type": "string"}}]
UNIQUE_VALUES: list[Any] = [
    [], ["a"], ["a", "b"], ["a", "a"], ["b", "a", "b"], [1], [1, 1], [1, "1"], [1, 1.0], [1.0, 1.5], [None],
    [None, None], ["a", None], [True, 1], [True, True], [0, False], [["a"], ["b"]], [["a"], ["a"]],
]


@pytest.mark.parametrize("items", UNIQUE_ITEMS, ids=json.dumps)
@pytest.mark.parametrize("where", ["alone", "array of objects", "optional", "nullable"])
def test_unique_items_are_never_taken_where_jsonschema_refuses_them(items, where):
    unique = {"type": ["array", "null"] if where == "nullable" else "array", "items": items,
              "uniqueItems": True}
    schema = unique if where == "alone" else {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "v": unique},
        "required": ["id"] if where == "optional" else ["id", "v"], "additionalProperties": False}}
    quick = valid_json_check(schema)

    def document(value: Any) -> Any:
        # Between two good arrays: every object's array is looked at, not only the first.
        return value if where == "alone" else [{"id": 1, "v": []}, {"id": 2, "v": value}, {"id": 3, "v": []}]

    lenient, stricter = [], []
    values = [*UNIQUE_VALUES, *([None] if where == "nullable" else [])]
    for value in values:
        valid = jsonschema.Draft202012Validator(schema).is_valid(document(value))
        taken = quick(json.dumps(document(value)))
        if taken and not valid:
            lenient.append(value)
        if valid and not taken:
            stricter.append(value)
    assert lenient == []
    if where == "optional":
        assert quick(json.dumps([{"id": 1}, {"id": 2, "v": ["a", "a"]}])) is False
        assert quick(json.dumps([{"id": 1}, {"id": 2, "v": []}]))
    if items.get("enum") or items.get("type") in ("string", "integer"):
        # Items msgspec decodes as strings and integers only: exactly jsonschema's answer.
        assert stricter == []


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_a_nested_object_s_checks_are_made_for_every_item_of_the_outer_array(required):
    inner = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "uniqueItems": True}},
             "required": ["tags"], "additionalProperties": False}
    outer = {"type": "object", "properties": {"id": {"type": "integer"}, "in": inner},
             "required": ["id", "in"] if required else ["id"], "additionalProperties": False}
    schema = {"type": "array", "items": outer}
    quick = valid_json_check(schema)
    for tags in (["a"], ["a", "b"], ["b", "b"], []):
        # The odd one in the middle: the check reaches past the first item.
        document = [{"id": 1, "in": {"tags": ["a"]}}, {"id": 2, "in": {"tags": tags}},
                    {"id": 3, "in": {"tags": []}}]
        assert quick(json.dumps(document)) == jsonschema.Draft202012Validator(schema).is_valid(document), tags
    if not required:
        assert quick(json.dumps([{"id": 1}, {"id": 2, "in": {"tags": ["a"]}}]))
        assert not quick(json.dumps([{"id": 1}, {"id": 2, "in": {"tags": ["a", "a"]}}]))
