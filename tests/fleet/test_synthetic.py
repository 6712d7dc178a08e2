"""The one synthetic-host generator: what it builds is valid, and never a GPU no real one could be."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuadmin.demo import fleet as demo_scenario
from gpuadmin.fleet.findings import rules
from gpuadmin.fleet.intake.validation import parse_snapshot
from gpuadmin.fleet.process_tree import process_rows
from gpuadmin.fleet.synthetic import (
    GPU_MEMORY_BYTES,
    DemoHost,
    GiB,
    gpu,
    memory_contradictions,
    proc,
    snapshot,
)
from gpuadmin.wire.signing import canonical_json

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
KEY = Ed25519PrivateKey.generate()


def held_per_gpu(document: dict) -> dict[str, int]:
    held: dict[str, int] = {}
    for process in document["processes"]:
        for uuid, held_bytes in process["gpu_memory_bytes"].items():
            held[uuid] = held.get(uuid, 0) + held_bytes
    return held


# Many seeds: a host's figures are drawn from its name and the round; sizes from one GPU to many
# processes on few GPUs (the case that once put 122.6 GiB of processes on an 80 GiB card).
@pytest.mark.parametrize(("gpus", "processes"), [(1, 200), (2, 400), (4, 40), (8, 200), (8, 1000), (0, 30)])
def test_no_gpu_of_any_host_in_any_round_holds_more_than_it_uses_or_uses_more_than_it_has(
        gpus: int, processes: int) -> None:
    for index in range(16):
        host = DemoHost(index=index, name=f"demo-{index:04d}", gpus=gpus, processes=processes, key=KEY)
        for round_number in range(0, 40, 10):
            document = host.document(round_number, taken_at=NOW)
            assert memory_contradictions(document) == [], (host.name, round_number)
            held = held_per_gpu(document)
            for card in document["gpus"]:
                assert held.get(card["uuid"], 0) <= card["memory_used_bytes"] <= card["memory_total_bytes"]
    parse_snapshot(canonical_json(document), now=NOW)


def test_busy_gpus_are_shared_out_and_the_same_processes_keep_their_memory_from_round_to_round() -> None:
    host = DemoHost(index=3, name="demo-0003", gpus=8, processes=1000, key=KEY)
    first, second = host.document(0, taken_at=NOW), host.document(1, taken_at=NOW)
    assert max(held_per_gpu(first).values()) > GPU_MEMORY_BYTES // 2  # busy, yet within the card
    memory = [{**p["gpu_memory_bytes"]} for p in first["processes"]]
    unchanged = sum(a == {**b["gpu_memory_bytes"]} for a, b in zip(memory, second["processes"], strict=True))
    assert unchanged >= 0.8 * len(memory)  # most processes are steady: a benchmark's steady snapshot


def test_only_hosts_with_the_unattributed_trait_show_memory_no_process_accounts_for() -> None:
    # A fleet where every GPU raised this finding would be a fleet where every host needs attention:
    # the pages and ingest would be measured on what no lab sees (NVML's v2 `used` leaves the driver's
    # reserved memory out).
    flagged = {}
    for index in range(24):
        host = DemoHost(index=index, name=f"demo-{index:04d}", gpus=8, processes=200, key=KEY)
        document = host.document(0, taken_at=NOW)
        found = rules.unattributed_memory(document, process_rows(document))
        flagged[host.name] = sorted(draft.details["gpu_index"] for draft in found)
    with_trait = {name for name, indexes in flagged.items() if indexes}
    assert 0 < len(with_trait) < len(flagged) / 2, flagged
    # The trait adds memory to every third GPU, and only there.
    assert all(flagged[name] == [0, 3, 6] for name in with_trait), flagged


def test_the_demo_scenarios_hosts_are_possible_gpus_too() -> None:
    for host in demo_scenario.HOSTS:
        document = demo_scenario.document(host, NOW)
        assert memory_contradictions(document) == []
        parse_snapshot(canonical_json(document), now=NOW)


def test_memory_contradictions_names_what_no_gpu_can_report() -> None:
    uuid = "GPU-sim-0000"
    holders = [proc(10, gpu_memory={uuid: 70 * GiB}), proc(11, gpu_memory={uuid: 53 * GiB})]
    assert memory_contradictions(snapshot(processes=holders, gpus=[gpu(0, used=80 * GiB)])) == [
        f"GPU 0: processes hold {123 * GiB} bytes, {80 * GiB} used"]
    assert memory_contradictions(snapshot(gpus=[gpu(0, total=80 * GiB, used=81 * GiB)])) == [
        f"GPU 0: {81 * GiB} bytes used of {80 * GiB}"]
