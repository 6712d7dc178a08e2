"""The compiled schema check (fastjsonschema) and the quick one (tests/fleet/test_schema_types.py)
are never more lenient than jsonschema; valid snapshots pass them.

A document the fast check accepts is stored without asking jsonschema, so for
every mutation here the fast check must refuse whatever jsonschema refuses.
"""

import copy
import json
from typing import Any

import pytest
from fastjsonschema.exceptions import JsonSchemaException

from gpuadmin.fleet.schema_types import NOT_VALID
from gpuadmin.fleet.validation import fast_snapshot_check, quick_snapshot_decoder, snapshot_validator
from tests.factories import GiB, gpu, proc, slurm_owner, snapshot


def fast_accepts(document: dict[str, Any]) -> bool:
    try:
        fast_snapshot_check()(document)
    except JsonSchemaException:
        return False
    return True


def jsonschema_accepts(document: dict[str, Any]) -> bool:
    return next(iter(snapshot_validator().iter_errors(document)), None) is None


def good() -> dict[str, Any]:
    return snapshot("gpu01", processes=[
        proc(10, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"], owner=slurm_owner()),
        proc(11, ppid=10, state="Z", cmdline=[], reasons=["zombie"]),
    ], gpus=[gpu(0, used=2 * GiB)])


def test_a_valid_snapshot_passes_the_fast_check_and_is_left_unchanged():
    document = good()
    before = copy.deepcopy(document)
    assert fast_accepts(document)
    assert document == before


def mutations() -> list[tuple[str, Any]]:
    def at(path: tuple[Any, ...], value: Any) -> Any:
        def mutate(document: dict[str, Any]) -> None:
            target = document
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        return mutate

    def drop(path: tuple[Any, ...]) -> Any:
        def mutate(document: dict[str, Any]) -> None:
            target = document
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        return mutate

    cases = [
        ("pid as a float", at(("processes", 0, "pid"), 10.0)),
        ("pid as a boolean", at(("processes", 0, "pid"), True)),
        ("negative pid", at(("processes", 0, "pid"), -1)),
        ("pid_max as 1e300", at(("host", "pid_max"), 1e300)),
        ("memory as a float", at(("gpus", 0, "memory_used_bytes"), 1.0 * GiB)),
        ("state as a number", at(("processes", 0, "state"), 1)),
        ("extra field", at(("processes", 0, "surprise"), 1)),
        ("extra top-level field", at(("surprise",), 1)),
        ("missing pid", drop(("processes", 0, "pid"))),
        ("missing host", drop(("host",))),
        ("huge command line argument", at(("processes", 0, "cmdline"), ["x" * 100_000])),
        ("taken_at without Z", at(("taken_at",), "2026-12-01T00:00:00+01:00")),
        ("schema version 3", at(("schema_version",), 3)),
        ("owner of an unknown kind", at(("processes", 0, "owner"), {"kind": "vm", "id": "1"})),
        ("gpus not a list", at(("gpus",), {})),
        ("name as a number", at(("host", "name"), 7)),
        ("utilization over 100", at(("gpus", 0, "utilization_percent"), 101)),
        ("reasons with an unknown word", at(("processes", 0, "reasons"), ["curious"])),
        ("gpu memory as a float", at(("processes", 0, "gpu_memory_bytes"), {"GPU-sim-0000": 1.0})),
        ("negative gpu memory", at(("processes", 0, "gpu_memory_bytes"), {"GPU-sim-0000": -1})),
    ]
    return cases


@pytest.mark.parametrize(("label", "mutate"), mutations(), ids=[label for label, _ in mutations()])
def test_the_fast_and_the_quick_check_refuse_what_jsonschema_refuses(label, mutate):
    document = good()
    mutate(document)
    assert not jsonschema_accepts(document), f"{label}: not a mutation jsonschema refuses"
    assert not fast_accepts(document), f"{label}: the fast check let through what jsonschema refuses"
    quick = quick_snapshot_decoder()(json.dumps(document))
    assert quick is NOT_VALID, f"{label}: the quick check let that through too"
