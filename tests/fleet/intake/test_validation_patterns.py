"""The schema's patterns mean what JSON Schema says they mean (ECMA-262): ``^…$`` is the whole text.

Python's ``$`` also matches before a final newline, and jsonschema and msgspec search patterns with
Python's ``re``: "gpu01\\n" passed ``^[A-Za-z0-9][A-Za-z0-9._-]*$`` and became a second host awaiting
acceptance. Both checks (quick, full) must refuse it, and the full one says which field.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuadmin.fleet.intake.schema_types import NOT_VALID
from gpuadmin.fleet.intake.validation import HOST_NAME_PATTERN, parse_snapshot, quick_snapshot_decoder
from tests.factories import container_owner, proc
from tests.fleet.helpers import NOW, good, rejection
from tests.fleet.intake.test_validation_fast import jsonschema_accepts

DIGEST = "0123456789abcdef" * 4


def with_value(where: str, value: str) -> dict[str, Any]:
    """A good snapshot with ``value`` at ``where``: the host's name, or a field of its second process."""
    document = good(processes=[proc(10), proc(11, owner=container_owner(DIGEST))])
    if where == "host.name":
        document["host"]["name"] = value
    elif where == "container_id":
        document["processes"][1]["owner"]["container_id"] = value
    else:
        document["processes"][1][where] = value
    return document


FIELDS = {  # where -> (a value the pattern takes, the field's path in the refusal)
    "host.name": ("gpu01", r"host\.name"),
    "cmdline_sha256": (DIGEST, r"processes\[1\]\.cmdline_sha256"),
    "container_id": (DIGEST, r"processes\[1\]\.owner\.container_id"),
    "state": ("S", r"processes\[1\]\.state"),
}


@pytest.mark.parametrize("where", FIELDS)
def test_a_value_with_a_final_newline_is_refused_by_every_check_and_the_refusal_names_the_field(where):
    fine, path = FIELDS[where]
    document = with_value(where, fine + "\n")
    text = json.dumps(document)
    assert quick_snapshot_decoder()(text) is NOT_VALID
    assert not jsonschema_accepts(document)  # the full check agrees with the quick one
    assert re.match(rf"{path}: '{re.escape(fine)}\\n' does not match '\^", rejection(text).message)


@pytest.mark.parametrize("name", ["gpu01", "a", "gpu-07.lab.example", "node_3", "X" * 253])
def test_usual_host_names_are_accepted_quickly_and_by_the_full_check(name):
    document = with_value("host.name", name)
    assert HOST_NAME_PATTERN.fullmatch(name)
    assert quick_snapshot_decoder()(json.dumps(document)) is not NOT_VALID
    assert jsonschema_accepts(document)
    assert parse_snapshot(json.dumps(document), now=NOW)["host"]["name"] == name


def test_a_taken_at_with_a_final_newline_is_refused_by_its_pattern():
    document = good()
    document["taken_at"] += "\n"
    assert not jsonschema_accepts(document)
    assert quick_snapshot_decoder()(json.dumps(document)) is NOT_VALID
    assert rejection(json.dumps(document)).message.startswith("taken_at: ")
