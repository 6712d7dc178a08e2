"""Full snapshot or update (gpuadmin/agent/snapshot_choice.py): what the agent decides per probe,
with its state in a real file, as a pool process of the agent's worker keeps it. No database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuadmin.agent.snapshot_choice import Choice, Limits, choose
from gpuadmin.fleet.synthetic import GiB, gpu, proc, slurm_owner, snapshot
from gpuadmin.wire.signing import MessageKind, generate_private_key, open_envelope
from gpuadmin.wire.snapshot_update import decode_update, snapshot_digest

KEY = generate_private_key()
G0 = "GPU-sim-0000"
MiB = 2**20
LIMITS = Limits(full_every_seconds=300, snapshot_max_bytes=8 * 2**20, update_max_bytes=64 * 1024,
                step_bytes=64 * MiB)
T0 = 1_800_000_000.0


def doc(*, memory: int = 10 * GiB, other: int = GiB, state: str = "R", owner: Any = None,
        devices: tuple[str, ...] = ("/dev/nvidia0",), more: bool = False, used: int = 12 * GiB,
        elapsed: float = 60.0) -> dict[str, Any]:
    processes = [
        proc(101, state=state, owner=owner, gpu_memory={G0: memory}, device_files=list(devices),
             reasons=["gpu"], elapsed_seconds=elapsed),
        proc(102, gpu_memory={G0: other}, device_files=["/dev/nvidia0"], reasons=["gpu"],
             elapsed_seconds=elapsed),
    ]
    if more:
        processes.append(proc(103, gpu_memory={G0: GiB}, reasons=["gpu"]))
    return snapshot("gpu-agent", processes=processes, gpus=[gpu(0, used=used, utilization_percent=70)])


@pytest.fixture
def probe(tmp_path: Path):
    path = tmp_path / "state.json"

    def probe(document: dict[str, Any], *, at: float = 0, full: bool = False,
              limits: Limits = LIMITS) -> Choice:
        return choose(document, KEY, state_path=path, now=T0 + at, limits=limits, full_requested=full)

    probe.path = path  # type: ignore[attr-defined]
    return probe


def test_the_first_probe_is_full_and_names_itself_as_the_base(probe) -> None:
    choice = probe(doc())

    assert (choice.kind, choice.reason) == (MessageKind.SNAPSHOT, "no full snapshot sent yet")
    open_envelope(choice.message, MessageKind.SNAPSHOT)
    assert json.loads(probe.path.read_text())["base"] == snapshot_digest(choice.message["text"])


def test_only_memory_moved_is_an_update_naming_what_moved_past_the_step(probe) -> None:
    base = probe(doc())

    first = probe(doc(memory=11 * GiB, other=GiB + MiB, used=13 * GiB, elapsed=70), at=10)
    second = probe(doc(memory=11 * GiB, other=GiB + 2 * MiB, used=13 * GiB, elapsed=80), at=20)

    assert first.kind is second.kind is MessageKind.SNAPSHOT_UPDATE and first.reason == ""
    update = decode_update(open_envelope(first.message, MessageKind.SNAPSHOT_UPDATE).text)
    assert update.base == snapshot_digest(base.message["text"])
    assert [(p.pid, p.gpu_memory_bytes) for p in update.processes] == [(101, {G0: 11 * GiB})]
    assert [(g.uuid, g.memory_used_bytes, g.process_memory_bytes) for g in update.gpus] == [
        (G0, 13 * GiB, 12 * GiB + MiB)]
    # Relative to the base, so each update says all that moved since it; numbered in order.
    assert [p["pid"] for p in second.message_body()["processes"]] == [101]
    assert (first.message_body()["sequence"], second.message_body()["sequence"]) == (1, 2)
    assert len(first.message["text"]) < len(base.message["text"]) / 3


@pytest.mark.parametrize(("changed", "what"), [
    (doc(more=True), "a new process"),
    (doc(state="D"), "a state"),
    (doc(owner=slurm_owner("4242")), "an owner"),
    (doc(devices=("/dev/nvidia0", "/dev/nvidia-uvm")), "device files"),
])
def test_a_change_of_processes_states_owners_or_device_files_is_a_full_snapshot(probe, changed, what) -> None:
    probe(doc())

    choice = probe(changed, at=10)

    assert choice.kind is MessageKind.SNAPSHOT, what
    assert choice.reason == "processes, owners, device files or GPUs changed"
    assert probe(changed, at=20).kind is MessageKind.SNAPSHOT_UPDATE  # the new base


def test_the_timer_and_central_asking_make_a_full_snapshot(probe) -> None:
    probe(doc())
    assert probe(doc(), at=299).kind is MessageKind.SNAPSHOT_UPDATE

    timed = probe(doc(), at=300)
    asked = probe(doc(), at=310, full=True)

    assert (timed.kind, timed.reason) == (MessageKind.SNAPSHOT, "the full snapshot timer")
    assert (asked.kind, asked.reason) == (MessageKind.SNAPSHOT, "central asked for one")
    assert probe(doc(), at=320).message_body()["sequence"] == 1


def test_an_update_over_its_size_limit_goes_as_a_full_snapshot(probe) -> None:
    probe(doc())
    small = Limits(full_every_seconds=300, snapshot_max_bytes=8 * 2**20, update_max_bytes=200, step_bytes=MiB)

    choice = probe(doc(memory=20 * GiB), at=10, limits=small)

    assert (choice.kind, choice.reason) == (MessageKind.SNAPSHOT, "the update would be over its size limit")


def test_an_unreadable_state_file_means_a_full_snapshot(probe) -> None:
    probe(doc())
    probe.path.write_text("{half")

    assert probe(doc(), at=10).kind is MessageKind.SNAPSHOT
    assert probe(doc(), at=20).kind is MessageKind.SNAPSHOT_UPDATE
