"""Full snapshot or update: what the agent sends for one probe (gpuadmin/wire/snapshot_update.py).

A full snapshot when the agent has none to refer to (its first probe, a lost
state file), when the snapshot's shape changed (processes, their states,
owners, device files, GPUs, host facts: ``shape_digest``), when central asked
for one, at least every ``GPUADMIN_FULL_SNAPSHOT_SECONDS``, and when the update
would be over ``GPUADMIN_SNAPSHOT_UPDATE_MAX_BYTES``. Otherwise an update, the
next in the base's sequence.

What the last full snapshot was is kept in a small file in the agent's data
directory, not in memory: probes run in any of the worker's pool processes, and
the file's lock makes one probe's choice and the next one's follow each other.
The state is written before the message is sent: a message lost after that
makes a gap, which central refuses by asking for a full snapshot, while a
sequence number sent twice would be refused as a replay.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.probe.budget import envelope_size, seal_snapshot
from gpuadmin.wire.files import write_file
from gpuadmin.wire.signing import MessageKind, seal
from gpuadmin.wire.snapshot_update import (
    ProcessKey,
    build_update,
    process_memory,
    shape_digest,
    snapshot_digest,
)

logger = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class Limits:
    full_every_seconds: float
    snapshot_max_bytes: int
    update_max_bytes: int
    step_bytes: int


@dataclass(frozen=True, slots=True)
class Choice:
    """The signed message to send, its kind, and why a full snapshot was chosen ("" for an update)."""

    message: dict[str, Any]
    kind: MessageKind
    reason: str

    def message_body(self) -> dict[str, Any]:
        """What was signed, parsed."""
        body: dict[str, Any] = json.loads(self.message["text"])
        return body


@dataclass(slots=True)
class _State:
    host: str
    base: str
    sequence: int
    shape: str
    full_at: float
    memory: dict[ProcessKey, dict[str, int | None]]

    def to_json(self) -> str:
        return json.dumps({"v": STATE_VERSION, "host": self.host, "base": self.base,
                           "sequence": self.sequence, "shape": self.shape, "full_at": self.full_at,
                           "memory": [[pid, start, memory] for (pid, start), memory in self.memory.items()]})


def _read_state(path: Path) -> _State | None:
    """The state in ``path``; None when there is none or it is not one (a full snapshot follows)."""
    try:
        raw = json.loads(path.read_text(encoding="ascii"))
        if raw.get("v") != STATE_VERSION:
            return None
        return _State(host=str(raw["host"]), base=str(raw["base"]), sequence=int(raw["sequence"]),
                      shape=str(raw["shape"]), full_at=float(raw["full_at"]),
                      memory={(int(pid), int(start)): dict(memory) for pid, start, memory in raw["memory"]})
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as error:
        logger.warning("snapshot state %s is unreadable (%s): sending a full snapshot", path, error)
        return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def full_reason(state: _State | None, document: dict[str, Any], shape: str, *, now: float,
                full_requested: bool, limits: Limits) -> str:
    """Why this probe must be a full snapshot; "" when an update will do."""
    if full_requested:
        return "central asked for one"
    if state is None:
        return "no full snapshot sent yet"
    if state.host != document["host"]["name"]:
        return "another host name"
    if state.shape != shape:
        return "processes, owners, device files or GPUs changed"
    if now - state.full_at >= limits.full_every_seconds or now < state.full_at:
        return "the full snapshot timer"
    return ""


def choose(document: dict[str, Any], key: Ed25519PrivateKey, *, state_path: Path, now: float,
           limits: Limits, full_requested: bool = False) -> Choice:
    """The message for this probe's ``document`` (a full snapshot as taken), signed, its state kept."""
    shape = shape_digest(document)
    with _locked(state_path):
        state = _read_state(state_path)
        reason = full_reason(state, document, shape, now=now, full_requested=full_requested, limits=limits)
        if not reason:
            assert state is not None
            update = build_update(document, base=state.base, sequence=state.sequence + 1,
                                  base_memory=state.memory, step_bytes=limits.step_bytes)
            message = seal(update, MessageKind.SNAPSHOT_UPDATE, key)
            if envelope_size(message) <= limits.update_max_bytes:
                state.sequence += 1
                write_file(state_path, state.to_json(), sync=False)
                return Choice(message, MessageKind.SNAPSHOT_UPDATE, "")
            reason = "the update would be over its size limit"
        message = seal_snapshot(document, key, max_bytes=limits.snapshot_max_bytes)
        new_state = _State(host=document["host"]["name"], base=snapshot_digest(message["text"]), sequence=0,
                           shape=shape, full_at=now, memory=process_memory(document))
        write_file(state_path, new_state.to_json(), sync=False)
        return Choice(message, MessageKind.SNAPSHOT, reason)
