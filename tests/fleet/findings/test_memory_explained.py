"""Each GPU's memory explained (fleet/findings/memory_explained.py): the numbers compared, and each gap nobody
frees with its cause and remedy. Pure: snapshots from the factories, checked as central would."""

from __future__ import annotations

import json
from typing import Any

from gpuadmin.fleet.findings.memory_explained import memory_explained
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.process_tree import process_rows
from tests.factories import GiB, container_owner, gpu, proc, snapshot

GPU0 = "GPU-sim-0000"
CID = "a" * 64
CONTEXT_FILES = ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]


def explained(processes: list[dict[str, Any]], used: int | None,
              unmatched: list[dict[str, Any]] | None = None, threshold: int = GiB) -> Any:
    document = snapshot(processes=processes, gpus=[gpu(0, used=used)], unmatched=unmatched)
    document = parse_snapshot(json.dumps(document))  # only what central accepts
    return memory_explained(document, process_rows(document), threshold_bytes=threshold).get(GPU0)


def test_every_gap_with_its_cause_and_the_numbers_compared() -> None:
    launcher_gone = {"pgid": 500, "sid": 500}  # their group leader, 500, is not in the snapshot
    processes = [
        proc(10, gpu_memory={GPU0: 10 * GiB}),  # a healthy trainer: nothing to explain
        proc(20, gpu_memory={GPU0: 2 * GiB}, orphaned=True, **launcher_gone),
        proc(21, gpu_memory={GPU0: 2 * GiB}, orphaned=True, **launcher_gone),
        proc(30, gpu_memory={GPU0: 3 * GiB}, leader_exited=True),
        proc(40, state="D", gpu_memory={GPU0: GiB}, wchan="nfs_wait_bit_killable",
             kernel_stack=["nfs_wait_bit_killable [nfs]", "__wait_on_bit", "out_of_line_wait_on_bit", "x"]),
        proc(50, owner=container_owner(CID, name="trainer"), container_id=CID, device_files=CONTEXT_FILES),
    ]
    unmatched = [{"pid": 7, "gpu_uuid": GPU0, "used_memory_bytes": 5 * GiB}]

    memory = explained(processes, used=30 * GiB, unmatched=unmatched)

    compared = (memory.used_bytes, memory.visible_bytes, memory.other_namespace_bytes,
                memory.no_process_bytes)
    assert compared == (30 * GiB, 18 * GiB, 5 * GiB, 7 * GiB)
    assert memory.compared == ("30 GiB used, 18 GiB by visible processes, 5 GiB by PIDs outside /proc, "
                               "7 GiB by no process")
    by_cause = {gap.cause: gap for gap in memory.gaps}
    assert list(by_cause) == ["orphans", "leader_exited", "uninterruptible", "other_namespace", "no_process"]
    assert by_cause["orphans"].seen == "4 GiB held by orphans of a dead launcher (pid 20, 21)"
    assert "kill request" in by_cause["orphans"].remedy
    assert by_cause["leader_exited"].pids == (30,)
    assert "Kill the process" in by_cause["leader_exited"].remedy
    assert by_cause["uninterruptible"].seen == (
        "1 GiB held by pid 40 in D state, waiting in nfs_wait_bit_killable "
        "(nfs_wait_bit_killable [nfs] < __wait_on_bit < out_of_line_wait_on_bit)")
    assert "No signal acts" in by_cause["uninterruptible"].remedy
    assert by_cause["other_namespace"].seen == "5 GiB held by PID 7, which this host's /proc does not show"
    assert "docker trainer" in by_cause["other_namespace"].remedy
    assert by_cause["no_process"].memory_bytes == 7 * GiB


def test_memory_no_process_holds_is_driver_held_and_names_who_holds_the_device() -> None:
    smi = proc(60, name="nvidia-smi", device_files=["/dev/nvidia0", "/dev/nvidiactl"])
    memory = explained([smi], used=8 * GiB)

    (gap,) = memory.gaps
    assert (gap.cause, gap.memory_bytes, gap.pids) == ("no_process", 8 * GiB, (60,))
    assert gap.seen == "8 GiB held by no process the GPU lists; pid 60 hold /dev/nvidia0 with no memory shown"
    assert gap.remedy.startswith("Driver-held")
    assert "nvidia-smi -r -i 0" in gap.remedy


def test_a_container_holding_the_device_without_memory_is_the_likely_holder() -> None:
    container = proc(50, owner=container_owner(CID, name="vllm"), container_id=CID,
                     device_files=CONTEXT_FILES)

    (gap,) = explained([container], used=8 * GiB).gaps

    assert gap.remedy.startswith("Most likely docker vllm")


def test_nothing_to_explain_below_the_threshold_or_without_used_memory() -> None:
    assert explained([proc(10, gpu_memory={GPU0: GiB})], used=GiB + GiB // 2).gaps == ()
    assert explained([], used=None) is None
