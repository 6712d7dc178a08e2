"""`make run` with the simulated backend and no file: two GPUs whose memory moves, part held by it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuadmin.probe.gpus import simulated
from gpuadmin.run import configure_demo_gpus


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUADMIN_DATA_DIR", str(tmp_path))
    return tmp_path


def test_the_demo_file_is_written_and_named_for_the_worker(data_dir: Path) -> None:
    environ = {"GPUADMIN_GPU_BACKEND": "simulated"}
    path = configure_demo_gpus(environ)
    assert path == data_dir / "simulated-gpus.json"
    assert environ["GPUADMIN_SIMULATED_GPUS"] == str(path)
    document = json.loads(path.read_text())
    assert document["processes"][0]["pid"] == os.getpid()
    early = simulated.read(str(path), clock=lambda: 0.0)
    later = simulated.read(str(path), clock=lambda: 300.0)
    assert early.available and later.available
    assert early.gpus[0].memory_used_bytes != later.gpus[0].memory_used_bytes
    assert early.gpus[1].memory_used_bytes != later.gpus[1].memory_used_bytes


@pytest.mark.parametrize(
    "environ",
    [
        {"GPUADMIN_GPU_BACKEND": "auto"},
        {"GPUADMIN_GPU_BACKEND": "simulated", "GPUADMIN_SIMULATED_GPUS": "/x"},
    ],
)
def test_a_real_backend_or_a_named_file_is_left_alone(data_dir: Path, environ: dict[str, str]) -> None:
    before = dict(environ)
    assert configure_demo_gpus(environ) is None
    assert environ == before
    assert not (data_dir / "simulated-gpus.json").exists()
