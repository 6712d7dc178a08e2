"""Decide whether a snapshot sent by an agent may be stored, and say why not.

Agents run on machines any lab member can log into, so a snapshot is untrusted
input: it is checked for size before it is parsed, against the JSON Schema that
the probe is tested against (gpuadmin/wire/snapshot.schema.json), and for the
things a schema cannot say (duplicate PIDs, memory on a GPU that is not listed,
a clock far ahead, numbers too big for a database column). Every refusal is a
``SnapshotRejected`` whose message a lab admin can act on; it is shown on the
host's page, so it also carries the host name when one can be read at all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import chain, islice
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any, cast

from django.conf import settings
from django.utils import timezone
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match

from gpuadmin.fleet.history.retention import history_kept_since
from gpuadmin.fleet.intake.schema_types import (
    NOT_VALID,
    checked_json_decoder,
    for_property_value,
    python_pattern,
)
from gpuadmin.fleet.process_tree import memory_by_gpu, memory_total_bytes
from gpuadmin.fleet.taken_at import parse_taken_at
from gpuadmin.text import clip, human_bytes

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "wire" / "snapshot.schema.json"

# A host's clock may run a little ahead of central's; more than this and its
# taken_at would sort every later snapshot (and every other host's) wrongly.
MAX_CLOCK_AHEAD = timedelta(minutes=5)

# Linux's PID_MAX_LIMIT on 64-bit kernels: no pid, pgid, sid or pid_max is larger.
PID_MAX_LIMIT = 4_194_304
# Columns are PostgreSQL integer / bigint: a bigger number would fail the
# INSERT after validation and be retried forever instead of rejected once.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

HOST_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# Finds the host name in a payload that cannot be parsed (truncated, oversized);
# bounded repetitions keep it linear on hostile input.
_HOST_NAME_IN_TEXT = re.compile(
    r'"host"\s*:\s*\{[^{}]{0,4096}?"name"\s*:\s*"([A-Za-z0-9][A-Za-z0-9._-]{0,252})"'
)
_HOST_NAME_SCAN_BYTES = 64 * 1024
_MESSAGE_PART_MAX_CHARS = 300
_SCHEMA_ERRORS_CONSIDERED = 50


class SnapshotRejected(Exception):
    """A snapshot that will not be stored. ``message`` says why, for people."""

    def __init__(self, message: str, *, host_name: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.host_name = host_name

    def __str__(self) -> str:
        return self.message


def _strict_integer(_checker: Any, instance: Any) -> bool:
    # Draft 2020-12 counts 1.0 (and 1e300) as an integer; a PID or a byte count
    # that is a float is a broken probe, and 1e300 does not fit any column.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _pattern(validator: Any, pattern: str, instance: Any, _schema: Any) -> Iterator[ValidationError]:
    # jsonschema's own "pattern" searches with Python's "$", which also matches before a final newline
    # ("gpu01\n" passed the host name's ^...$). This one means what JSON Schema (ECMA-262) means, as the
    # quick check (schema_types) does.
    if validator.is_type(instance, "string") and not _compiled_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@lru_cache(maxsize=64)
def _compiled_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(python_pattern(pattern))


def snapshot_schema() -> dict[str, Any]:
    """A fresh copy of the snapshot schema (each checker below builds from its own, some change it)."""
    return cast(dict[str, Any], json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


@lru_cache(maxsize=1)
def snapshot_validator() -> Draft202012Validator:
    """The schema validator, built once per process (the schema does not change at run time)."""
    schema = snapshot_schema()
    Draft202012Validator.check_schema(schema)
    strict = validators.extend(
        Draft202012Validator,
        validators={"pattern": _pattern},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
    )
    return strict(schema)


def supported_schema_versions() -> tuple[int, ...]:
    """The versions central accepts: the schema file's schema_version enum, so that
    the file stays the one place a version is added (an older agent keeps working
    while hosts are upgraded one by one)."""
    # jsonschema types a schema as bool | Mapping; ours is the object in SCHEMA_PATH.
    schema = cast(dict[str, Any], snapshot_validator().schema)
    return tuple(schema["properties"]["schema_version"]["enum"])


def parse_snapshot(payload: str | bytes, *, now: datetime | None = None) -> dict[str, Any]:
    """Return the snapshot document in ``payload``, or raise ``SnapshotRejected``.

    ``now`` is central's clock (defaults to the current time), against which
    a taken_at too far in the future is refused.
    """
    if not isinstance(payload, str | bytes | bytearray):
        raise SnapshotRejected(f"snapshot must arrive as JSON text, got a {type(payload).__name__}")
    max_bytes = settings.GPUADMIN_SNAPSHOT_MAX_BYTES
    size_bytes = payload_size_bytes(payload)
    if size_bytes > max_bytes:
        raise SnapshotRejected(
            f"snapshot is {human_bytes(size_bytes)}, over the limit of {human_bytes(max_bytes)} "
            "(GPUADMIN_SNAPSHOT_MAX_BYTES); run the probe without --all, or raise the limit",
            host_name=host_name_from_text(payload),
        )
    document = quick_snapshot_decoder()(payload)
    quick = document is not NOT_VALID
    if quick:
        # Valid JSON under the schema, numbers within 64 bits, already plain values.
        suspect = _may_hold_suspect_text(payload if isinstance(payload, str) else bytes(payload).decode())
    else:
        document, suspect = _decode(payload)
    host_name = _host_name_from_document(document)
    try:
        if not quick:
            _check_schema_version(document)
            _check_schema(document)
        _check_semantics(document, now=now or timezone.now(), walk=suspect)
    except SnapshotRejected as rejected:
        rejected.host_name = host_name
        raise
    return document


def payload_size_bytes(payload: str | bytes) -> int:
    if isinstance(payload, bytes | bytearray):
        return len(payload)
    if not isinstance(payload, str):
        return 0
    if len(payload) > settings.GPUADMIN_SNAPSHOT_MAX_BYTES or payload.isascii():
        # Each character is at least one byte (too big already), or exactly one (signed snapshots
        # are ASCII): no copy of ~125 KB to count.
        return len(payload)
    return len(payload.encode("utf-8", "surrogatepass"))


def host_name_from_text(payload: str | bytes) -> str:
    """The host name in a payload that could not be parsed, or "" (best effort)."""
    head = payload[:_HOST_NAME_SCAN_BYTES]
    if not isinstance(head, str):
        head = bytes(head).decode("utf-8", "replace")
    match = _HOST_NAME_IN_TEXT.search(head)
    return match.group(1) if match else ""


def _host_name_from_document(document: Any) -> str:
    host = document.get("host") if isinstance(document, dict) else None
    name = host.get("name") if isinstance(host, dict) else None
    if isinstance(name, str) and HOST_NAME_PATTERN.fullmatch(name):
        return name
    return ""


# --- decoding -------------------------------------------------------------


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a 64-bit float")
    return value


# What ``_check_strings_and_numbers`` refuses can only come from these in the JSON text: a NUL is
# written \u0000 (a raw one is invalid JSON), a lone surrogate \udXXX or, in a str payload, the raw
# character (UTF-8 bytes cannot hold one). Valid pairs match too: they only cost the walk.
_SUSPECT_TEXT = re.compile(r"\\u0000|\\u[dD][89a-fA-F]|[\ud800-\udfff]")

# An integer beyond 64 bits has at least this many characters (JSON has no leading zeros).
_INT64_DIGITS = len(str(INT64_MAX))


def _may_hold_suspect_text(text: str) -> bool:
    """Whether ``_SUSPECT_TEXT`` can match: an ASCII text without any \\u escape cannot. Asked first
    in C over the whole text, so that the regex runs only on the rare text that may need it; a text
    without any backslash (most) is told by one memchr, where a two-character search looks at each byte."""
    if text.isascii() and ("\\" not in text or "\\u" not in text):
        return False
    return _SUSPECT_TEXT.search(text) is not None


def _decode(payload: str | bytes) -> tuple[Any, bool]:
    """The document, and whether it may hold what ``_check_strings_and_numbers`` refuses.

    That walk visits every value (about 6,000 in a 200-process snapshot); the
    answer here comes from one scan of the text and the parser's number hooks,
    so the walk, which names the offending path, runs only when it can find
    something.
    """
    big_number = False

    def parse_int(text: str) -> int:
        nonlocal big_number
        if len(text) >= _INT64_DIGITS:
            big_number = True
        return int(text)

    def parse_float(text: str) -> float:
        nonlocal big_number
        value = _finite_float(text)
        if abs(value) > INT64_MAX:
            big_number = True
        return value

    try:
        # JSON on the wire is UTF-8 (RFC 8259); json.loads would guess UTF-16/32 from bytes.
        text = payload.decode("utf-8") if isinstance(payload, bytes | bytearray) else payload
        document = json.loads(text, parse_constant=_reject_constant, parse_float=parse_float,
                              parse_int=parse_int)
    except UnicodeDecodeError as error:
        raise SnapshotRejected(
            f"snapshot is not UTF-8 text (byte {error.start}): {error.reason}",
            host_name=host_name_from_text(payload),
        ) from None
    except json.JSONDecodeError as error:
        raise SnapshotRejected(
            f"snapshot is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            host_name=host_name_from_text(payload),
        ) from None
    except ValueError as error:  # NaN, Infinity, 1e400
        raise SnapshotRejected(
            f"snapshot is not valid JSON: {_clip(str(error))}", host_name=host_name_from_text(payload)
        ) from None
    except RecursionError:
        raise SnapshotRejected(
            "snapshot is not valid JSON: nested too deeply", host_name=host_name_from_text(payload)
        ) from None
    if not isinstance(document, dict):
        raise SnapshotRejected(f"snapshot must be a JSON object, got {_json_type(document)}")
    return document, big_number or _may_hold_suspect_text(text)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


# --- schema ---------------------------------------------------------------


def _check_schema_version(document: dict[str, Any]) -> None:
    version = document.get("schema_version")
    supported = supported_schema_versions()
    if version in supported and not isinstance(version, bool | float):
        return
    shown = "missing" if "schema_version" not in document else _clip(json.dumps(version))
    accepted = " or ".join(str(v) for v in supported)
    raise SnapshotRejected(
        f"schema_version {shown} is not supported: this central accepts schema_version "
        f"{accepted}; run the same gpuadmin version on the host and on central"
    )


@lru_cache(maxsize=1)
def quick_snapshot_decoder() -> Callable[[str | bytes], Any]:
    """``text -> document``: the snapshot as plain values when the JSON text is certainly a valid
    snapshot of a supported schema version with no number beyond 64 bits, else ``NOT_VALID``: one
    pass of msgspec over the text with types built from the schema (fleet/intake/schema_types.py), one set
    per version, the newest tried first; about a sixth of parsing with ``json`` and checking with
    compiled code. ``NOT_VALID`` may still be valid (a value the types do not know): ``parse_snapshot``
    then parses with ``_decode`` and asks jsonschema, which names the error."""
    schema = snapshot_schema()
    decoders = [
        checked_json_decoder(for_property_value(schema, "schema_version", version), largest_number=INT64_MAX)
        for version in sorted(supported_schema_versions(), reverse=True)
    ]

    def decode(text: str | bytes) -> Any:
        for decoder in decoders:
            document = decoder(text)
            if document is not NOT_VALID:
                return document
        return NOT_VALID

    return decode


def _check_schema(document: dict[str, Any]) -> None:
    errors = islice(snapshot_validator().iter_errors(document), _SCHEMA_ERRORS_CONSIDERED)
    error: ValidationError | None = best_match(errors)
    if error is not None:
        raise SnapshotRejected(f"{json_path(error.absolute_path)}: {_clip(error.message)}")


def json_path(parts: Iterator[str | int] | Any) -> str:
    """``processes[3].gpu_memory_bytes["GPU-1"]`` for a jsonschema path; "snapshot" for the root."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            text += f".{part}" if text else part
        else:
            text += f"[{_clip(json.dumps(part))}]"
    return text or "snapshot"


# --- what the schema cannot say ------------------------------------------


def _check_semantics(document: dict[str, Any], *, now: datetime, walk: bool) -> None:
    """What the schema cannot say; ``walk``: look at every string and number (``_decode`` says
    when that can find anything)."""
    _check_taken_at(document["taken_at"], now=now)
    if walk:
        _check_strings_and_numbers(document, "")
    _check_column_ranges(document)
    gpu_uuids = _check_gpus(document["gpus"])
    _check_processes(document["processes"], gpu_uuids)
    for i, unmatched in enumerate(document["unmatched_gpu_processes"]):
        if unmatched["gpu_uuid"] not in gpu_uuids:
            raise SnapshotRejected(
                f"unmatched_gpu_processes[{i}].gpu_uuid: GPU {_clip(json.dumps(unmatched['gpu_uuid']))} "
                "is not in gpus"
            )


def _check_taken_at(text: str, *, now: datetime) -> None:
    try:
        taken_at = parse_taken_at(text)
    except ValueError:
        raise SnapshotRejected(f"taken_at: {_clip(json.dumps(text))} is not a valid date and time") from None
    ahead = taken_at - now
    if ahead > MAX_CLOCK_AHEAD:
        raise SnapshotRejected(
            f"taken_at: {text} is {_duration(ahead)} ahead of central's clock (at most "
            f"{_duration(MAX_CLOCK_AHEAD)} allowed); fix the host's clock (NTP)"
        )
    # Older than anything central keeps, it would be pruned at once; and a date near year 1 would
    # overflow ingest's arithmetic on it (the lives' refresh window) instead of being refused.
    if taken_at < history_kept_since(now):
        raise SnapshotRejected(
            f"taken_at: {text} is {_duration(-ahead)} before central's clock, older than anything "
            f"central keeps (GPUADMIN_HISTORY_DAYS = {settings.GPUADMIN_HISTORY_DAYS}); "
            "fix the host's clock (NTP)"
        )


def _check_strings_and_numbers(value: Any, path: str) -> None:
    """No NUL, no lone surrogate (PostgreSQL refuses both), no number beyond 64 bits."""
    if isinstance(value, str):
        _check_string(value, path)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_string(key, path or "snapshot")
            _check_strings_and_numbers(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_strings_and_numbers(item, f"{path}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise SnapshotRejected(f"{path}: {value} is larger than a 64-bit integer")


def _check_string(text: str, path: str) -> None:
    if "\x00" in text:
        raise SnapshotRejected(f"{path}: contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SnapshotRejected(f"{path}: contains a lone UTF-16 surrogate, not valid Unicode text") from None


def _check_column_ranges(document: dict[str, Any]) -> None:
    host = document["host"]
    _at_most(host["pid_max"], PID_MAX_LIMIT, "host.pid_max", "Linux's PID_MAX_LIMIT")
    _at_most(host["pids_in_use"], INT32_MAX, "host.pids_in_use", "2147483647")
    for name, count in document["process_counts"].items():
        _at_most(count, INT32_MAX, f"process_counts.{name}", "2147483647")
    for i, gpu in enumerate(document["gpus"]):
        _at_most(gpu["index"], INT32_MAX, f"gpus[{i}].index", "2147483647")
    processes = document["processes"]
    for field, limit, limit_name in _PROCESS_COLUMN_LIMITS:
        # Field by field over all processes (~200), the largest found in C; a message only for the first
        # too big. (None and 0 are left out: neither is too big.)
        values = [process.get(field) for process in processes]
        if max(filter(None, values), default=0) <= limit:
            continue
        for i, value in enumerate(values):
            if value is not None and value > limit:
                _at_most(value, limit, f"processes[{i}].{field}", limit_name)


_PROCESS_COLUMN_LIMITS = [
    *((field, PID_MAX_LIMIT, "Linux's PID_MAX_LIMIT") for field in ("pid", "ppid", "pgid", "sid")),
    ("uid", INT32_MAX, "2147483647"),
]


def _at_most(value: int, limit: int, path: str, limit_name: str) -> None:
    if value > limit:
        raise SnapshotRejected(f"{path}: {value} is greater than {limit_name} ({limit})")


def _check_gpus(gpus: list[dict[str, Any]]) -> set[str]:
    seen_uuids: dict[str, int] = {}
    seen_indices: dict[int, int] = {}
    for i, gpu in enumerate(gpus):
        if gpu["uuid"] in seen_uuids:
            raise SnapshotRejected(
                f"gpus[{i}].uuid: GPU {_clip(json.dumps(gpu['uuid']))} is listed twice "
                f"(also gpus[{seen_uuids[gpu['uuid']]}])"
            )
        if gpu["index"] in seen_indices:
            raise SnapshotRejected(
                f"gpus[{i}].index: GPU index {gpu['index']} is listed twice "
                f"(also gpus[{seen_indices[gpu['index']]}])"
            )
        seen_uuids[gpu["uuid"]] = i
        seen_indices[gpu["index"]] = i
    return set(seen_uuids)


def _check_processes(processes: list[dict[str, Any]], gpu_uuids: set[str]) -> None:
    if _processes_plainly_fine(processes, gpu_uuids):
        return
    # Something is wrong: one process after the other, to name the first error.
    seen_pids: dict[int, int] = {}
    for i, process in enumerate(processes):
        pid = process["pid"]
        if pid in seen_pids:
            raise SnapshotRejected(
                f"processes[{i}].pid: pid {pid} is listed twice (also processes[{seen_pids[pid]}])"
            )
        seen_pids[pid] = i
        for uuid in process["gpu_memory_bytes"]:
            if uuid not in gpu_uuids:
                raise SnapshotRejected(
                    f"processes[{i}].gpu_memory_bytes: GPU {_clip(json.dumps(uuid))} is not in gpus"
                )
        # Central adds memory up as process_tree does, a process's over its GPUs (ProcessLife) and a
        # GPU's over its processes (Gpu.memory_attributed_bytes): the sums must fit bigint columns too.
        if memory_total_bytes(process["gpu_memory_bytes"]) > INT64_MAX:
            raise SnapshotRejected(f"processes[{i}].gpu_memory_bytes: adds up to more than a 64-bit integer")
        for uuid in process.get("gpu_utilization_percent", ()):
            if uuid not in gpu_uuids:
                raise SnapshotRejected(
                    f"processes[{i}].gpu_utilization_percent: GPU {_clip(json.dumps(uuid))} is not in gpus"
                )
        for j, instance in enumerate(process.get("mig_instances", ())):
            if instance["gpu_uuid"] not in gpu_uuids:
                uuid = _clip(json.dumps(instance["gpu_uuid"]))
                raise SnapshotRejected(
                    f"processes[{i}].mig_instances[{j}].gpu_uuid: GPU {uuid} is not in gpus"
                )
    for uuid, used_bytes in memory_by_gpu(p["gpu_memory_bytes"] for p in processes).items():
        if used_bytes > INT64_MAX:
            raise SnapshotRejected(
                f"processes: the memory they hold on GPU {_clip(json.dumps(uuid))} adds up to more than a "
                "64-bit integer"
            )


def _processes_plainly_fine(processes: list[dict[str, Any]], gpu_uuids: set[str]) -> bool:
    """Whether ``_check_processes`` finds nothing wrong, asked of all ~200 processes at once, in C, so
    that the Python walk runs only to name an error. Memory is never negative (the schema): when
    all of it adds up to a 64-bit integer, so does each process's and each GPU's."""
    pids = list(map(_PID, processes))
    memories = list(map(_GPU_MEMORY, processes))
    mig_instances = chain.from_iterable(map(_MIG_INSTANCES, processes))
    return (
        len(set(pids)) == len(pids)
        and gpu_uuids.issuperset(chain.from_iterable(memories))
        and gpu_uuids.issuperset(chain.from_iterable(map(_GPU_UTILIZATION, processes)))
        and gpu_uuids.issuperset(map(_GPU_UUID, mig_instances))
        and sum(filter(None, chain.from_iterable(map(dict.values, memories)))) <= INT64_MAX
    )


_PID = itemgetter("pid")
_GPU_MEMORY = itemgetter("gpu_memory_bytes")
_MIG_INSTANCES = methodcaller("get", "mig_instances", ())
_GPU_UUID = itemgetter("gpu_uuid")
_GPU_UTILIZATION = methodcaller("get", "gpu_utilization_percent", ())


# --- wording --------------------------------------------------------------


def _clip(text: str) -> str:
    return clip(text, _MESSAGE_PART_MAX_CHARS)


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds >= 2 * 3600:
        return f"{seconds // 3600} hours"
    if seconds >= 120:
        return f"{seconds // 60} minutes"
    return f"{seconds} seconds"
