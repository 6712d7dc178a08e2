"""The quick schema check (msgspec, tests/fleet/intake/test_schema_types.py) is never more lenient than
jsonschema, for each schema version it has types for; valid snapshots pass it.

A document the quick check accepts is stored without asking jsonschema, so for
every mutation here, of a snapshot of each version, it must refuse whatever jsonschema refuses.
"""

import json
from typing import Any

import pytest

from gpuadmin.fleet.intake.schema_types import NOT_VALID
from gpuadmin.fleet.intake.validation import (
    quick_snapshot_decoder,
    snapshot_validator,
    supported_schema_versions,
)
from tests.factories import GiB, gpu, proc, slurm_owner, snapshot


def jsonschema_accepts(document: dict[str, Any]) -> bool:
    return next(iter(snapshot_validator().iter_errors(document)), None) is None


def good(version: int = 2) -> dict[str, Any]:
    """A valid snapshot; of schema version 1, without the owners version 2 requires."""
    document = snapshot("gpu01", processes=[
        proc(10, gpu_memory={"GPU-sim-0000": GiB}, reasons=["gpu"], owner=slurm_owner()),
        proc(11, ppid=10, state="Z", cmdline=[], reasons=["zombie"]),
    ], gpus=[gpu(0, used=2 * GiB)])
    if version == 1:
        document["schema_version"] = 1
        for process in document["processes"]:
            del process["owner"]
    return document


@pytest.mark.parametrize("version", supported_schema_versions())
def test_a_valid_snapshot_of_each_version_passes_the_quick_check(version):
    document = good(version)
    assert jsonschema_accepts(document)
    assert quick_snapshot_decoder()(json.dumps(document)) == document


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

    def version_2_without_an_owner(document: dict[str, Any]) -> None:
        document["schema_version"] = 2
        document["processes"][1].pop("owner", None)

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
        ("version 2 with a process without an owner", version_2_without_an_owner),
        ("gpus not a list", at(("gpus",), {})),
        ("name as a number", at(("host", "name"), 7)),
        ("utilization over 100", at(("gpus", 0, "utilization_percent"), 101)),
        ("reasons with an unknown word", at(("processes", 0, "reasons"), ["curious"])),
        ("gpu memory as a float", at(("processes", 0, "gpu_memory_bytes"), {"GPU-sim-0000": 1.0})),
        ("negative gpu memory", at(("processes", 0, "gpu_memory_bytes"), {"GPU-sim-0000": -1})),
    ]
    return cases


@pytest.mark.parametrize("version", supported_schema_versions())
@pytest.mark.parametrize(("label", "mutate"), mutations(), ids=[label for label, _ in mutations()])
def test_the_quick_check_refuses_what_jsonschema_refuses(label, mutate, version):
    document = good(version)
    mutate(document)
    assert not jsonschema_accepts(document), f"{label}: not a mutation jsonschema refuses"
    quick = quick_snapshot_decoder()(json.dumps(document))
    assert quick is NOT_VALID, f"{label}: the quick check let that through"
