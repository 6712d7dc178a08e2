"""A snapshot update: what an agent sends instead of a full snapshot when only figures moved.

Most snapshots say what the last one said: the same processes, owners and
device files, GPU memory and utilisation moved a little. The agent then sends a
small signed update (``MessageKind.SNAPSHOT_UPDATE``, same envelope and key as a
snapshot) keyed to the last full snapshot it sent, its *base*:

- ``base``: the base's digest (``snapshot_digest`` of its signed text), and
  ``sequence``: 1, 2, 3... since that base. Central applies an update only to
  the base it stored and only as the next of that base's sequence, so a replayed,
  reordered or lost update is refused (a lost one makes central ask for a full
  snapshot: the next update would otherwise hide what the lost one said);
- the figures taken now: each GPU's memory, utilisation and the varying part of
  its health, and per GPU the memory the snapshot's processes hold
  (``process_memory_bytes``, what central calls attributed); the process counts
  and PIDs in use;
- ``processes``: each process whose GPU memory on some GPU differs from its value
  in the base by more than the history step, with its whole ``gpu_memory_bytes``.
  Relative to the base, not to the previous update, so an update alone says
  everything that moved since the base.

What an update cannot say is everything else (``shape_digest``): when it
changes, the agent sends a full snapshot. The JSON Schema beside this file
(``snapshot_update.schema.json``) documents the shape; ``decode_update`` checks it
(msgspec, strict, unknown fields refused) and what a schema cannot say.

Plain library: no Django, no Celery (the agent uses it).
"""

from __future__ import annotations

import copy
import hashlib
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import msgspec

from gpuadmin.wire.signing import canonical_json

UPDATE_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("snapshot_update.schema.json")
DIGEST_PREFIX = "sha256:"
# An update's own limit, well under a full snapshot's (GPUADMIN_SNAPSHOT_MAX_BYTES): an update over it
# is not sent, the agent sends a full snapshot instead (docs/snapshot.md).
DEFAULT_UPDATE_MAX_BYTES = 256 * 1024
# The varying part of gpus[].health (the rest changes rarely, and a change of it is a full snapshot).
HEALTH_FIGURES = ("temperature_celsius", "power_draw_milliwatts", "power_limit_milliwatts")
MAX_GPUS = 256
MAX_PROCESSES = 20_000
_INT64_MAX = 2**63 - 1

_Bytes = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class BadUpdate(ValueError):
    """An update that is not well formed; the message says what is wrong."""


class GpuHealthFigures(msgspec.Struct, forbid_unknown_fields=True):
    temperature_celsius: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    power_draw_milliwatts: _Bytes | None = None
    power_limit_milliwatts: _Bytes | None = None


class GpuFigures(msgspec.Struct, forbid_unknown_fields=True):
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    memory_used_bytes: _Bytes | None
    utilization_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] | None
    process_memory_bytes: _Bytes
    health: GpuHealthFigures | None = None


class ProcessMemory(msgspec.Struct, forbid_unknown_fields=True):
    pid: Annotated[int, msgspec.Meta(ge=1, le=4_194_304)]
    start_time_ticks: Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
    gpu_memory_bytes: dict[Annotated[str, msgspec.Meta(min_length=1, max_length=128)], _Bytes | None]


class ProcessCounts(msgspec.Struct, forbid_unknown_fields=True):
    total: _Count
    zombies: _Count
    uninterruptible: _Count
    omitted: _Count


class SnapshotUpdate(msgspec.Struct, forbid_unknown_fields=True):
    update_version: int
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    base: Annotated[str, msgspec.Meta(pattern="^sha256:[0-9a-f]{64}$")]
    sequence: Annotated[int, msgspec.Meta(ge=1, le=_INT64_MAX)]
    taken_at: str
    pids_in_use: _Count
    process_counts: ProcessCounts
    gpus: Annotated[list[GpuFigures], msgspec.Meta(max_length=MAX_GPUS)]
    processes: Annotated[list[ProcessMemory], msgspec.Meta(max_length=MAX_PROCESSES)]
    probe_duration_seconds: Annotated[float, msgspec.Meta(ge=0)] | None = None


_DECODER = msgspec.json.Decoder(SnapshotUpdate, strict=True)


def snapshot_digest(text: str) -> str:
    """The digest a full snapshot is named by as a base: SHA-256 of its signed (canonical) text."""
    return DIGEST_PREFIX + hashlib.sha256(text.encode("ascii")).hexdigest()


def decode_update(text: str) -> SnapshotUpdate:
    """The update in ``text`` (the signed text), or BadUpdate naming what is wrong."""
    try:
        update = _DECODER.decode(text)
    except msgspec.ValidationError as error:
        raise BadUpdate(f"not a valid snapshot update: {error}") from None
    except msgspec.DecodeError as error:
        raise BadUpdate(f"a snapshot update is JSON: {error}") from None
    if update.update_version != UPDATE_VERSION:
        raise BadUpdate(f"update_version {update.update_version} is not {UPDATE_VERSION}, the one read here")
    try:
        taken = datetime.fromisoformat(update.taken_at)
    except ValueError:
        raise BadUpdate(f"taken_at {update.taken_at[:40]!r} is not an ISO 8601 moment") from None
    if taken.tzinfo is None or not update.taken_at.endswith("Z"):
        raise BadUpdate("taken_at must be UTC, written with a 'Z'")
    uuids = [g.uuid for g in update.gpus]
    if len(set(uuids)) != len(uuids):
        raise BadUpdate("a GPU is listed twice")
    keys = [(p.pid, p.start_time_ticks) for p in update.processes]
    if len(set(keys)) != len(keys):
        raise BadUpdate("a process is listed twice")
    return update


# --- the agent's side: what must not change, and what moved ------------------------------

# Per process, what varies from one probe to the next without the process set changing: sent as
# figures (gpu_memory_bytes' values) or not at all (its age, resident memory and own utilisation:
# the usage ledger keeps the last full snapshot's utilisation figures until the next one).
_PROCESS_FIGURES = ("elapsed_seconds", "rss_bytes", "gpu_utilization_percent")
_GPU_FIGURES = ("memory_used_bytes", "utilization_percent")


def shape_digest(document: dict[str, Any]) -> str:
    """A digest of everything in a snapshot an update cannot say: equal digests, an update will do.

    The processes (identity, state, owner, device files, the GPUs they hold memory on), the host's facts
    but its PIDs in use, the GPUs and their health but the figures an update carries, the backend,
    what was left out. Figures are left out: the time, process counts, memory and utilisation.
    """
    shaped = {key: value for key, value in document.items()
              if key not in ("taken_at", "probe_duration_seconds", "process_counts")}
    shaped["host"] = {k: v for k, v in document["host"].items() if k != "pids_in_use"}
    shaped["gpus"] = [_gpu_shape(g) for g in document["gpus"]]
    shaped["processes"] = [_process_shape(p) for p in document["processes"]]
    return DIGEST_PREFIX + hashlib.sha256(canonical_json(shaped).encode("ascii")).hexdigest()


def _gpu_shape(gpu: dict[str, Any]) -> dict[str, Any]:
    shaped = {k: v for k, v in gpu.items() if k not in _GPU_FIGURES}
    if "mig_instances" in gpu:
        shaped["mig_instances"] = [{k: v for k, v in m.items() if k != "memory_used_bytes"}
                                   for m in gpu["mig_instances"]]
    if isinstance(gpu.get("health"), dict):
        shaped["health"] = {k: v for k, v in gpu["health"].items() if k not in HEALTH_FIGURES}
    return shaped


# Running and sleeping are one: a busy process flips between them from one probe to the next, and
# nothing central keeps tells them apart. A change to or from D, Z, T... is a new shape.
_ACTIVE_STATES = frozenset("RS")


def _process_shape(process: dict[str, Any]) -> dict[str, Any]:
    shaped = {k: v for k, v in process.items() if k not in _PROCESS_FIGURES}
    if shaped.get("state") in _ACTIVE_STATES:
        shaped["state"] = "RS"
    shaped["gpu_memory_bytes"] = sorted(process.get("gpu_memory_bytes") or {})
    if "mig_instances" in process:
        shaped["mig_instances"] = [{k: v for k, v in m.items() if k != "used_memory_bytes"}
                                   for m in process["mig_instances"]]
    return shaped


ProcessKey = tuple[int, int]


def process_memory(document: dict[str, Any]) -> dict[ProcessKey, dict[str, int | None]]:
    """Each GPU-memory holder's ``gpu_memory_bytes``, by (pid, start time): what an update compares."""
    return {(p["pid"], p["start_time_ticks"]): dict(p["gpu_memory_bytes"])
            for p in document["processes"] if p.get("gpu_memory_bytes")}


def moved(before: dict[str, int | None], now: dict[str, int | None], *, step_bytes: int) -> bool:
    """Whether a process's memory on some GPU moved by more than ``step_bytes`` (or became (un)known)."""
    for uuid, used in now.items():
        was = before.get(uuid)
        if (used is None) != (was is None):
            return True
        if used is not None and was is not None and abs(used - was) > step_bytes:
            return True
    return False


def build_update(
    document: dict[str, Any],
    *,
    base: str,
    sequence: int,
    base_memory: dict[ProcessKey, dict[str, int | None]],
    step_bytes: int,
) -> dict[str, Any]:
    """The update saying what ``document`` (a full snapshot with the base's shape) adds to the base."""
    per_gpu: dict[str, int] = {}
    for process in document["processes"]:
        for uuid, used in (process.get("gpu_memory_bytes") or {}).items():
            per_gpu[uuid] = per_gpu.get(uuid, 0) + (used or 0)
    gpus = []
    for g in document["gpus"]:
        figures: dict[str, Any] = {"uuid": g["uuid"], "memory_used_bytes": g["memory_used_bytes"],
                                   "utilization_percent": g["utilization_percent"],
                                   "process_memory_bytes": per_gpu.get(g["uuid"], 0)}
        if isinstance(g.get("health"), dict):
            figures["health"] = {name: g["health"].get(name) for name in HEALTH_FIGURES}
        gpus.append(figures)
    processes = []
    for key, memory in process_memory(document).items():
        if moved(base_memory.get(key, {}), memory, step_bytes=step_bytes):
            processes.append({"pid": key[0], "start_time_ticks": key[1], "gpu_memory_bytes": memory})
    update: dict[str, Any] = {
        "update_version": UPDATE_VERSION,
        "host": document["host"]["name"],
        "base": base,
        "sequence": sequence,
        "taken_at": document["taken_at"],
        "pids_in_use": document["host"]["pids_in_use"],
        "process_counts": dict(document["process_counts"]),
        "gpus": gpus,
        "processes": processes,
    }
    if document.get("probe_duration_seconds") is not None:
        update["probe_duration_seconds"] = document["probe_duration_seconds"]
    return update


# --- central's readers: the base with its latest update laid over it -----------------------


def overlay(document: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The base ``document`` as its ``update`` (a decoded update, as plain values) says it is now.

    A new document; ``document`` is not changed. Processes' ages move on by the time between the two;
    their resident memory stays the base's (an update does not carry it).
    """
    result = copy.copy(document)
    age_seconds = seconds_between(document["taken_at"], update["taken_at"])
    result["taken_at"] = update["taken_at"]
    if update.get("probe_duration_seconds") is not None:
        result["probe_duration_seconds"] = update["probe_duration_seconds"]
    result["host"] = {**document["host"], "pids_in_use": update["pids_in_use"]}
    result["process_counts"] = dict(update["process_counts"])
    figures = {g["uuid"]: g for g in update["gpus"]}
    gpus = []
    for g in document["gpus"]:
        new = figures.get(g["uuid"])
        if new is None:
            gpus.append(g)
            continue
        gpu = {**g, "memory_used_bytes": new["memory_used_bytes"],
               "utilization_percent": new["utilization_percent"]}
        if isinstance(g.get("health"), dict) and new.get("health") is not None:
            gpu["health"] = {**g["health"], **new["health"]}
        gpus.append(gpu)
    result["gpus"] = gpus
    memory = {(p["pid"], p["start_time_ticks"]): p["gpu_memory_bytes"] for p in update["processes"]}
    processes = []
    for p in document["processes"]:
        changed = memory.get((p["pid"], p["start_time_ticks"]))
        elapsed = p.get("elapsed_seconds")
        if changed is None and elapsed is None:
            processes.append(p)
            continue
        process = dict(p)
        if changed is not None:
            process["gpu_memory_bytes"] = dict(changed)
        if elapsed is not None:
            process["elapsed_seconds"] = aged(elapsed, age_seconds)
        processes.append(process)
    result["processes"] = processes
    return result


def seconds_between(base_taken_at: str, update_taken_at: str) -> float:
    """How much older the processes are at an update than in its base (both ``taken_at`` texts)."""
    return (datetime.fromisoformat(update_taken_at) - datetime.fromisoformat(base_taken_at)).total_seconds()


def aged(elapsed_seconds: float, age_seconds: float) -> float:
    """A process's ``elapsed_seconds`` in the base, ``age_seconds`` later (as an overlaid document says)."""
    return round(elapsed_seconds + age_seconds, 2)
