"""The quick schema check (fleet/schema_predicates.py, validation.quick_snapshot_check) is never more
lenient than jsonschema: whatever it accepts, jsonschema accepts. It may refuse a valid document;
the full check then has the word, so such a document is still stored."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpuadmin.fleet.schema_predicates import predicate
from gpuadmin.fleet.validation import SnapshotRejected, parse_snapshot, quick_snapshot_check, snapshot_schema
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner, snapshot
from tests.fleet.test_validation_fast import good, jsonschema_accepts

SCHEMA = snapshot_schema()
PROCESS_PROPERTIES = sorted(SCHEMA["$defs"]["process"]["properties"])
OWNER_PROPERTIES = sorted(SCHEMA["$defs"]["owner"]["properties"])
# Values of every JSON type, at and past the edges the schema draws.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 0.5, -0.5, 2**63, "", "x", "A", "AB", "a\n", "0" * 64, "g" * 64,
    "x" * 129, "x" * 257, "x" * 4097, "x" * 8193, [], ["x"], [1], ["gpu", "gpu"], ["gpu", "zombie"],
    ["x" * 8193], {}, {"a": 1}, {"a": -1}, {"a": 1.0}, {"a": None}, {"kind": "slurm_job"},
    {"kind": "vm"}, {str(n): 0 for n in range(257)},
]


def quick_accepts(document: dict[str, Any]) -> bool:
    return quick_snapshot_check()(document)


def test_a_usual_snapshot_is_accepted_quickly_and_left_unchanged():
    document = good()
    before = copy.deepcopy(document)
    assert quick_accepts(document)
    assert document == before


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


def test_a_missing_required_property_or_an_unknown_one_is_refused():
    for mutate in (lambda p: p.pop("cmdline_sha256"), lambda p: p.update(surprise=1)):
        document = good()
        mutate(document["processes"][1])
        assert not quick_accepts(document) and not jsonschema_accepts(document)


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


def test_a_predicate_refuses_under_a_keyword_it_does_not_know():
    dated = predicate({"type": "string", "format": "date-time"}, {})
    assert dated("2026-12-03T00:00:00Z") is False
    assert predicate({"$ref": "#/$defs/missing"}, {})("x") is False
    assert predicate({"$ref": "#/$defs/process", "type": "object"}, {})({}) is False
    assert predicate({"type": "integer", "minimum": 0}, {})(True) is False  # no boolean is an integer
    assert predicate({"enum": [1, None]}, {})(True) is False and predicate({"enum": [1, None]}, {})(1)
