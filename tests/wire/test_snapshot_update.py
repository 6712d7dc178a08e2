"""The snapshot update's shape (gpuadmin/wire/snapshot_update.py): its JSON Schema file and the
checking decoder say the same, and the base with an update laid over it reads as the host now."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest

from gpuadmin.fleet.synthetic import GiB, gpu, proc, snapshot
from gpuadmin.wire.signing import canonical_json
from gpuadmin.wire.snapshot_update import (
    SCHEMA_PATH,
    BadUpdate,
    build_update,
    decode_update,
    overlay,
    process_memory,
    shape_digest,
    snapshot_digest,
)

SCHEMA = json.loads(SCHEMA_PATH.read_text())
G0 = "GPU-sim-0000"
MiB = 2**20


# Fixed, not now: two calls of base() a few microseconds apart once rounded a process's age apart.
BASE_TAKEN_AT = datetime(2026, 12, 2, 12, 0, 0, 250_000, tzinfo=UTC)


def base() -> dict[str, Any]:
    return snapshot("gpu-wire", pids_in_use=300, taken_at=BASE_TAKEN_AT, processes=[
        proc(101, gpu_memory={G0: 10 * GiB}, reasons=["gpu"], elapsed_seconds=60.0),
        proc(102, gpu_memory={G0: GiB}, reasons=["gpu"], elapsed_seconds=30.0),
    ], gpus=[{**gpu(0, used=12 * GiB, utilization_percent=40),
              "health": {"temperature_celsius": 50, "power_draw_milliwatts": 100_000,
                         "power_limit_milliwatts": 300_000, "xid_errors": []}}])


def later(seconds: float, memory: int) -> dict[str, Any]:
    document = base()
    document["taken_at"] = document["taken_at"][:17] + f"{seconds:09.6f}Z"
    document["processes"][0]["gpu_memory_bytes"] = {G0: memory}
    document["gpus"][0]["utilization_percent"] = 99
    document["gpus"][0]["health"]["temperature_celsius"] = 80
    document["host"]["pids_in_use"] = 333
    return document


def update_of(document: dict[str, Any]) -> dict[str, Any]:
    first = base()
    return build_update(document, base=snapshot_digest(canonical_json(first)), sequence=1,
                        base_memory=process_memory(first), step_bytes=64 * MiB)


def test_a_built_update_passes_the_schema_and_the_decoder() -> None:
    update = update_of(later(30, 11 * GiB))

    jsonschema.validate(update, SCHEMA)
    decoded = decode_update(canonical_json(update))
    assert decoded.sequence == 1 and [p.pid for p in decoded.processes] == [101]


@pytest.mark.parametrize("spoil", [
    lambda u: u.update({"sequence": 0}),
    lambda u: u.update({"base": "sha256:XYZ"}),
    lambda u: u.update({"extra": 1}),
    lambda u: u["gpus"][0].update({"utilization_percent": 101}),
    lambda u: u["gpus"][0].update({"memory_used_bytes": -1}),
    lambda u: u["gpus"][0].update({"memory_used_bytes": 1.5}),
    lambda u: u["processes"][0].update({"pid": 0}),
    lambda u: u["process_counts"].pop("total"),
    lambda u: u.pop("taken_at"),
], ids=["sequence", "base", "unknown field", "utilization", "negative", "float", "pid", "count", "taken_at"])
def test_what_the_schema_refuses_the_decoder_refuses(spoil) -> None:
    update = update_of(later(30, 11 * GiB))
    spoil(update)

    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(update, SCHEMA)
    with pytest.raises(BadUpdate):
        decode_update(canonical_json(update))


def test_the_decoder_also_refuses_what_a_schema_cannot_say() -> None:
    update = update_of(later(30, 11 * GiB))
    with pytest.raises(BadUpdate, match="listed twice"):
        decode_update(canonical_json({**update, "gpus": update["gpus"] * 2}))
    with pytest.raises(BadUpdate, match="UTC"):
        decode_update(canonical_json({**update, "taken_at": "2026-12-02T12:00:00+01:00"}))


def test_figures_do_not_change_the_shape_and_processes_do() -> None:
    assert shape_digest(later(30, 20 * GiB)) == shape_digest(base())
    running, stuck = base(), base()
    running["processes"][0]["state"] = "R"  # a busy process between two probes: the same shape
    stuck["processes"][0]["state"] = "D"
    assert shape_digest(running) == shape_digest(base()) != shape_digest(stuck)
    moved_on = base()
    moved_on["processes"][1]["user"] = "mallory"
    assert shape_digest(moved_on) != shape_digest(base())
    # A process's own utilisation moves at every probe, and comes and goes with its samples.
    measured, busier = base(), base()
    measured["processes"][0]["gpu_utilization_percent"] = {"GPU-sim-0000": 40}
    busier["processes"][0]["gpu_utilization_percent"] = {"GPU-sim-0000": 95}
    assert shape_digest(measured) == shape_digest(busier) == shape_digest(base())


def test_the_base_with_its_update_laid_over_reads_as_the_host_now() -> None:
    now = later(30, 11 * GiB)
    shown = overlay(base(), update_of(now))

    assert shown["taken_at"] == now["taken_at"] and shown["host"]["pids_in_use"] == 333
    assert shown["gpus"][0]["utilization_percent"] == 99
    assert shown["gpus"][0]["health"] == {**base()["gpus"][0]["health"], "temperature_celsius": 80}
    assert shown["processes"][0]["gpu_memory_bytes"] == {G0: 11 * GiB}
    assert shown["processes"][1]["gpu_memory_bytes"] == {G0: GiB}
    # Ages move on with the clock (29.75 s from the base's 12:00:00.25); nothing else of a process changes.
    assert [p["elapsed_seconds"] for p in shown["processes"]] == [89.75, 59.75]
