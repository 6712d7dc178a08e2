"""A user with 400 device-holding processes and hostile arguments does not make the host vanish.

Real processes: a launcher forks 400 workers that each hold a temporary file
standing in for /dev/nvidia0, all with 4 KiB of control characters and markup
in their command line (six bytes each once escaped as JSON: the probe's
document alone would be over central's 8 MiB limit, so central would reject it
and the host would drop off the panel). The simulated GPU backend gives ten of
them GPU memory. What the agent signs (gpuadmin/probe/budget.py) goes through
central's own receive path: signature, size limit, schema, ingest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client, override_settings

from gpuadmin.fleet.intake.ingest import receive_snapshot
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.probe.budget import DEFAULT_SNAPSHOT_MAX_BYTES, envelope_size, seal_snapshot
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.snapshot import take_snapshot
from gpuadmin.wire.signing import MessageKind, seal
from tests.factories import GiB
from tests.keys import accept, host_key
from tests.probe.helpers import Processes, assert_valid

pytestmark = pytest.mark.django_db

HOST = "crowded"
GPU = "GPU-crowded-0"
WORKERS = 400
GPU_HOLDERS = 10
MARKUP = "\x1b[31m\u202e\"><img src=x onerror=alert(1)>"
HOSTILE = MARKUP + "\x01" * (4096 - len(MARKUP.encode()))  # 4 KiB; control characters grow most


@pytest.fixture
def crowd(processes: Processes, tmp_path: Path) -> tuple[dict, list[int]]:
    """The probe's document of this machine with the 400 workers, and the GPU holders' PIDs."""
    device = tmp_path / "fake-nvidia0"
    device.write_bytes(b"")
    launcher = processes.start("launcher", str(device), str(WORKERS), HOSTILE)
    workers = sorted(launcher.children)
    gpu_holders = workers[:: WORKERS // GPU_HOLDERS]
    simulated = tmp_path / "gpus.json"
    simulated.write_text(json.dumps({
        "gpus": [{"uuid": GPU, "name": "Simulated", "memory_total_bytes": 80 * GiB,
                  "extra_used_bytes": 0, "utilization_percent": 90}],
        "processes": [{"pid": pid, "gpu_uuid": GPU, "used_memory_bytes": GiB} for pid in gpu_holders],
    }))
    document = take_snapshot(ProbeConfig(
        host_name=HOST, device_glob=str(tmp_path / "fake-nvidia*"),
        gpu_backend="simulated", simulated_gpus_path=str(simulated),
    ))
    assert_valid(document)
    ours = [row for row in document["processes"] if row["pid"] in set(workers)]
    assert len(ours) == WORKERS and all("device" in row["reasons"] for row in ours)
    return document, gpu_holders


def receive(message: dict) -> dict:
    host = receive_snapshot(message)
    assert host is not None
    return LatestSnapshot.objects.document_for(host)


def test_400_hostile_device_holders_fit_the_default_limit_with_every_row(
    crowd, viewer_client: Client
) -> None:
    document, gpu_holders = crowd
    key = host_key(HOST)
    # As the probe took it, central would reject it: its signed text alone is over the limit.
    assert len(seal(document, MessageKind.SNAPSHOT, key)["text"]) > DEFAULT_SNAPSHOT_MAX_BYTES
    accept(HOST)

    message = seal_snapshot(document, key, max_bytes=DEFAULT_SNAPSHOT_MAX_BYTES)

    assert envelope_size(message) <= DEFAULT_SNAPSHOT_MAX_BYTES
    stored = receive(message)
    assert len(stored["processes"]) == len(document["processes"])  # cut command lines, no row lost
    assert stored["left_out"]["processes"] == 0
    assert stored["left_out"]["cmdlines_shortened"] >= WORKERS
    rows = {row["pid"]: row for row in stored["processes"]}
    assert all(rows[pid]["gpu_memory_bytes"] == {GPU: GiB} for pid in gpu_holders)
    assert "left out" not in viewer_client.get(f"/hosts/{HOST}/").content.decode()


@override_settings(GPUADMIN_SNAPSHOT_MAX_BYTES=256 * 1024)
def test_under_a_tight_limit_gpu_holders_stay_and_what_is_left_out_is_counted(
    crowd, viewer_client: Client
) -> None:
    document, gpu_holders = crowd
    accept(HOST)

    message = seal_snapshot(document, host_key(HOST), max_bytes=256 * 1024)

    assert envelope_size(message) <= 256 * 1024
    stored = receive(message)
    kept = {row["pid"]: row for row in stored["processes"]}
    assert set(gpu_holders) <= set(kept)
    for pid in gpu_holders:  # each with the chain of parents the process tree needs
        parent = kept[pid]["ppid"]
        assert parent in kept and kept[parent]["ppid"] in kept
    everything = {row["pid"]: row for row in document["processes"]}
    dropped = [row for pid, row in everything.items() if pid not in kept]
    assert dropped, "the limit is tight enough to leave rows out"
    left_out = stored["left_out"]
    assert left_out["processes"] == len(dropped) == len(everything) - len(kept)
    device_rows = [pid for pid, row in everything.items() if "device" in row["reasons"]]
    device_rows_dropped = len([pid for pid in device_rows if pid not in kept])
    assert 0 < device_rows_dropped == left_out["by_reason"]["device"]
    page = viewer_client.get(f"/hosts/{HOST}/").content.decode()
    assert f"{len(dropped)} processes left out" in page
