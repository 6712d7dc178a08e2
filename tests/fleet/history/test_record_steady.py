"""``history._is_steady`` says "nothing changes" exactly when ``_extended`` would return the stored
values: a steady life is neither built nor written, so a wrong answer would lose a change (or rewrite
every life). Checked over random sequences of snapshots of one process."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from gpuadmin.fleet.history.record import (
    _LIFE_COMPARED_FIELDS,
    _extended,
    _is_steady,
    description_digest,
)
from gpuadmin.fleet.process_tree import ProcessRow
from tests.factories import GiB, proc
from tests.fleet.helpers import at

GPU0 = "GPU-sim-0000"
STEP_BYTES = 64 * 1024**2


def stored(life: dict[str, Any]) -> dict[str, Any]:
    """An open life as ingest reads it back (history._OPEN_COLUMNS): compared values, pid, ticks."""
    return {**{name: life[name] for name in _LIFE_COMPARED_FIELDS}, "pk": 1,
            "pid": life["pid"], "start_time_ticks": life["start_time_ticks"]}


def next_record(rng: random.Random, record: dict[str, Any]) -> dict[str, Any]:
    """The process in the next snapshot: usually as it was, sometimes one thing different."""
    record = {**record}
    memory = record["gpu_memory_bytes"].get(GPU0, 0)
    change = rng.choice(["none", "none", "none", "wobble", "step", "free", "state", "zombie", "device",
                         "orphaned", "cmdline", "owner", "ppid", "user"])
    if change == "wobble":
        record["gpu_memory_bytes"] = {GPU0: memory + rng.choice([-1, 1]) * rng.randrange(1, STEP_BYTES)}
    elif change == "step":
        record["gpu_memory_bytes"] = {GPU0: memory + GiB}
    elif change == "free":
        record["gpu_memory_bytes"] = {}
    elif change == "state":
        record["state"] = rng.choice("RSD")
    elif change == "zombie":
        record["state"] = "Z"
    elif change == "device":
        record["device_files"] = [] if record["device_files"] else ["/dev/nvidia0"]
    elif change == "orphaned":
        record["orphaned"] = not record["orphaned"]
    elif change == "cmdline":
        record["cmdline"] = [*record["cmdline"], "--resume"]
    elif change == "owner":
        record["owner"] = {"kind": "slurm_job", "job_id": str(rng.randrange(100)), "step": "0", "uid": 1000}
    elif change == "ppid":
        record["ppid"] = rng.randrange(2, 50)
    elif change == "user":
        record["user"] = rng.choice(["alice", "bob"])
    if record["gpu_memory_bytes"].get(GPU0, 1) < 0:
        record["gpu_memory_bytes"] = {GPU0: 0}
    return record


def test_steady_exactly_when_extending_changes_no_stored_value() -> None:
    rng = random.Random(9)
    seen = {True: 0, False: 0}
    for _ in range(200):
        record = proc(10, gpu_memory={GPU0: 4 * GiB}, device_files=["/dev/nvidia0"], reasons=["gpu"])
        row = ProcessRow.from_document(record)
        life = stored(_extended(None, row, digest=description_digest(row), taken_at=at(0), seen_before=at(0),
                                step=STEP_BYTES))
        for n in range(1, 12):
            record = next_record(rng, record)
            row = ProcessRow.from_document(record)
            digest = description_digest(row)
            after = _extended(life, row, digest=digest, taken_at=at(10 * n), seen_before=at(10 * n - 10),
                              step=STEP_BYTES)
            unchanged = all(after[name] == life[name] for name in _LIFE_COMPARED_FIELDS)
            steady = _is_steady(life, row, digest, STEP_BYTES)
            assert steady == unchanged, (n, record, life, after)
            seen[steady] += 1
            life = stored(after)
    # Both answers came up often: the walk exercised the rule, not one side of it.
    assert min(seen.values()) > 300, seen


def test_a_gone_life_is_never_steady() -> None:
    row = ProcessRow.from_document(proc(10, gpu_memory={GPU0: GiB}, reasons=["gpu"]))
    digest = description_digest(row)
    life = stored(_extended(None, row, digest=digest, taken_at=at(0), seen_before=at(0), step=STEP_BYTES))
    assert _is_steady(life, row, digest, STEP_BYTES)
    life["gone_at"] = at(0) + timedelta(seconds=10)
    assert not _is_steady(life, row, digest, STEP_BYTES)
