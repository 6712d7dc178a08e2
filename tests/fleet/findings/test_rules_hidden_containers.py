"""The unattributed-memory remedy names the containers whose processes hold the GPU but show no memory."""

from __future__ import annotations

from django.test import override_settings

from gpuadmin.fleet.findings.rules import compute_findings, hidden_container_suspects
from gpuadmin.fleet.models import Finding
from gpuadmin.fleet.process_tree import process_rows
from tests.factories import GiB, container_owner, gpu, proc, slurm_owner, snapshot

GPU0 = "GPU-sim-0000"
CID_A, CID_B, CID_C = "a" * 64, "b" * 64, "c" * 64
CONTEXT_FILES = ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]


def in_container(pid: int, cid: str, name: str, **kwargs) -> dict:
    return proc(pid, owner=container_owner(cid, name=name), container_id=cid, **kwargs)


def unattributed(processes: list[dict], unmatched: list[dict] | None = None) -> Finding:
    gpus = [gpu(0, used=10 * GiB), gpu(1, used=0)]
    document = snapshot(processes=processes, gpus=gpus, unmatched=unmatched)
    (draft,) = [d for d in compute_findings(document) if d.kind == Finding.Kind.UNATTRIBUTED_MEMORY]
    return draft


@override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=GiB)
def test_a_container_holding_the_device_without_memory_is_named() -> None:
    draft = unattributed([
        in_container(10, CID_A, "trainer", device_files=CONTEXT_FILES),
        in_container(20, CID_B, "accounted", device_files=CONTEXT_FILES, gpu_memory={GPU0: GiB}),
        in_container(30, CID_C, "other-gpu", device_files=["/dev/nvidia1", "/dev/nvidiactl"]),
        proc(40, owner=slurm_owner(), device_files=CONTEXT_FILES),
    ])
    assert "look in docker trainer, whose processes hold the GPU's device files but show no memory" \
        in draft.remedy
    assert "accounted" not in draft.remedy and "other-gpu" not in draft.remedy
    assert draft.details["suspect_containers"] == [{"key": f"container:{CID_A}", "label": "docker trainer"}]
    assert "nvidia-smi --gpu-reset -i 0" in draft.remedy  # the rest of the remedy stays


@override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=GiB)
def test_with_unmatched_pids_the_containers_are_named_too() -> None:
    unmatched = [{"pid": 7, "gpu_uuid": GPU0, "used_memory_bytes": 9 * GiB}]
    draft = unattributed([in_container(10, CID_A, "trainer", device_files=["/dev/nvidiactl"])], unmatched)
    expected = "The GPU reports pid 7, which this host's /proc does not show: look in docker trainer"
    assert expected in draft.remedy


@override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=GiB)
def test_without_evidence_the_remedy_says_what_it_said_before() -> None:
    draft = unattributed([in_container(10, CID_A, "idle")])  # no device files: nothing says it uses a GPU
    assert "look for a container in another PID namespace" in draft.remedy
    assert draft.details["suspect_containers"] == []


def test_many_containers_are_listed_three_then_counted() -> None:
    rows = process_rows(snapshot(processes=[
        in_container(10 + i, f"{i:x}" * 64, f"c{i}", device_files=CONTEXT_FILES) for i in range(1, 6)
    ]))
    assert [w.label for w in hidden_container_suspects(rows, 0)] == [f"docker c{i}" for i in range(1, 6)]
    with override_settings(GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES=GiB):
        draft = unattributed([in_container(10 + i, f"{i:x}" * 64, f"c{i}", device_files=CONTEXT_FILES)
                              for i in range(1, 6)])
    assert "docker c1, docker c2, docker c3 and 2 more" in draft.remedy
    assert len(draft.remedy) <= 500
