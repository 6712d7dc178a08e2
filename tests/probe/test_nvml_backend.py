"""The nvml backend against a fake `pynvml` (no GPU here): initialisation
failures, missing functions and their fallbacks, per-device errors, and PIDs
that /proc does not know."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pynvml as real
import pytest

from tests.probe.conftest import Device
from tests.probe.fake_pynvml import NOT_AVAILABLE, FakeGpu, fake_pynvml
from tests.probe.helpers import Processes, free_pid, rows_by_pid, snapshot

GiB = 1024**3
Install = Callable[..., types.ModuleType]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Install:
    """Put a fake pynvml where `import pynvml` finds it, for this test only."""

    def put(*gpus: FakeGpu, **options: object) -> types.ModuleType:
        module = fake_pynvml(gpus, **options)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return put


@pytest.mark.parametrize(("code", "reason"), [
    (real.NVML_ERROR_LIBRARY_NOT_FOUND,
     "NVML library not found (libnvidia-ml.so.1; is the NVIDIA driver installed?)"),
    (real.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (real.NVML_ERROR_UNKNOWN, "NVML initialisation failed: Unknown Error"),
])
def test_auto_falls_back_to_none_with_the_reason_nvml_gave(
    install: Install, device: Device, code: int, reason: str
) -> None:
    install(init_error=code)

    auto = snapshot(device.glob, gpu_backend="auto")
    explicit = snapshot(device.glob, gpu_backend="nvml")

    assert auto["gpu_backend"] == {"name": "none", "available": False, "reason": reason}
    assert explicit["gpu_backend"] == {"name": "nvml", "available": False, "reason": reason}
    assert auto["gpus"] == explicit["gpus"] == []


def test_without_nvidia_ml_py_installed(monkeypatch: pytest.MonkeyPatch, device: Device) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail

    backend = snapshot(device.glob, gpu_backend="auto")["gpu_backend"]

    assert backend == {"name": "none", "available": False, "reason": "nvidia-ml-py (pynvml) is not installed"}


def test_compute_and_graphics_processes_with_unmatched_pids(
    install: Install, processes: Processes, device: Device
) -> None:
    trainer, renderer = processes.start("sleeper"), processes.start("sleeper")
    ghost = free_pid()
    install(
        FakeGpu("GPU-0", used=30 * GiB, reserved=GiB, utilization=88,
                compute=[(trainer.pid, 20 * GiB), (ghost, 9 * GiB)], graphics=[(renderer.pid, GiB)]),
        FakeGpu("GPU-1", used=0, utilization=0),
    )

    document = snapshot(device.glob, gpu_backend="auto")

    assert document["gpu_backend"] == {"name": "nvml", "available": True, "reason": None}
    assert document["host"]["driver_version"] == "550.54.14"
    gpu0, gpu1 = document["gpus"]
    assert gpu0 == {"index": 0, "uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB",
                    "memory_total_bytes": 80 * GiB, "memory_used_bytes": 30 * GiB, "utilization_percent": 88}
    assert gpu1["uuid"] == "GPU-1"
    rows = rows_by_pid(document)
    assert rows[trainer.pid]["gpu_memory_bytes"] == {"GPU-0": 20 * GiB}
    assert rows[renderer.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert "gpu" in rows[renderer.pid]["reasons"]
    assert ghost not in rows
    assert document["unmatched_gpu_processes"] == [
        {"pid": ghost, "gpu_uuid": "GPU-0", "used_memory_bytes": 9 * GiB}
    ]


@pytest.mark.parametrize("how", ["absent from the binding", "not found in the driver"])
def test_v3_missing_falls_back_to_v2(
    install: Install, processes: Processes, device: Device, how: str
) -> None:
    worker = processes.start("sleeper")
    v3 = ["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"]
    missing = {"absent": v3} if how.startswith("absent") else {"function_not_found": v3}
    module = install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)]), **missing)

    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in module.calls
    assert "nvmlDeviceGetComputeRunningProcesses" not in module.calls
    assert document["gpu_backend"]["reason"] is None


def test_v3_and_v2_missing_falls_back_to_v1(install: Install, processes: Processes, device: Device) -> None:
    worker = processes.start("sleeper")
    module = install(
        FakeGpu("GPU-0", compute=[(worker.pid, GiB)], graphics=[(worker.pid, GiB)]),
        absent=["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"],
        function_not_found=["nvmlDeviceGetComputeRunningProcesses_v2",
                            "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetMemoryInfo_v2"],
    )

    document = snapshot(device.glob, gpu_backend="nvml")

    assert "nvmlDeviceGetComputeRunningProcesses" in module.calls
    assert "nvmlDeviceGetGraphicsRunningProcesses" in module.calls
    # Listed as compute and as graphics: one holder, counted once.
    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert document["gpus"][0]["memory_total_bytes"] == 80 * GiB


def test_memory_info_v2_leaves_driver_reserved_memory_out(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", used=4 * GiB, reserved=GiB))
    assert snapshot(device.glob, gpu_backend="nvml")["gpus"][0]["memory_used_bytes"] == 4 * GiB

    install(FakeGpu("GPU-0", used=4 * GiB, reserved=GiB), function_not_found=["nvmlDeviceGetMemoryInfo_v2"])
    assert snapshot(device.glob, gpu_backend="nvml")["gpus"][0]["memory_used_bytes"] == 5 * GiB


def test_a_newer_binding_on_an_older_driver_raises_mismatch_for_unversioned_calls(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    module = install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)]),
                     function_not_found=["nvmlDeviceGetComputeRunningProcesses_v3"])

    def mismatch(handle: object) -> None:  # what nvidia-ml-py's unversioned wrapper does
        raise real.NVMLLibraryMismatchError("use a versioned function")

    module.nvmlDeviceGetComputeRunningProcesses = mismatch
    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}  # from _v2


def test_per_device_errors_become_nulls_and_reasons(install: Install, device: Device) -> None:
    install(
        FakeGpu("GPU-0", errors={"nvmlDeviceGetUtilizationRates": real.NVML_ERROR_NOT_SUPPORTED}),
        FakeGpu("GPU-1", errors={"nvmlDeviceGetMemoryInfo": real.NVML_ERROR_GPU_IS_LOST,
                                 "nvmlDeviceGetComputeRunningProcesses_v3": real.NVML_ERROR_GPU_IS_LOST}),
        FakeGpu("GPU-2", errors={"nvmlDeviceGetHandleByIndex": real.NVML_ERROR_UNKNOWN}),
    )

    document = snapshot(device.glob, gpu_backend="nvml")

    gpu0, gpu1, gpu2 = document["gpus"]
    assert gpu0["utilization_percent"] is None and gpu0["memory_total_bytes"] == 80 * GiB
    assert gpu1["memory_total_bytes"] is None and gpu1["memory_used_bytes"] is None
    assert gpu2 == {"index": 2, "uuid": "GPU-unknown-index-2", "name": "", "memory_total_bytes": None,
                    "memory_used_bytes": None, "utilization_percent": None}
    backend = document["gpu_backend"]
    assert backend["available"] is True
    assert "GPU 0 utilization: Not Supported" in backend["reason"]
    assert "GPU 1 memory: GPU is lost" in backend["reason"]
    assert "GPU 1 compute processes: GPU is lost" in backend["reason"]
    assert "GPU 2 handle: Unknown Error" in backend["reason"]


def test_no_device_count_means_no_gpu_data(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0"), errors={"nvmlDeviceGetCount": real.NVML_ERROR_UNKNOWN})

    backend = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]

    assert backend == {"name": "nvml", "available": False, "reason": "device count: Unknown Error"}


@pytest.mark.parametrize("value", [None, NOT_AVAILABLE])
def test_process_memory_not_available_is_null(
    install: Install, processes: Processes, device: Device, value: int | None
) -> None:
    worker = processes.start("sleeper")
    ghost = free_pid()
    install(FakeGpu("GPU-0", compute=[(worker.pid, value), (ghost, value)]))

    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": None}
    assert document["unmatched_gpu_processes"] == [
        {"pid": ghost, "gpu_uuid": "GPU-0", "used_memory_bytes": None}
    ]


def test_nvml_is_initialised_once_per_process(install: Install, device: Device) -> None:
    module = install(FakeGpu("GPU-0"))

    snapshot(device.glob, gpu_backend="nvml")
    snapshot(device.glob, gpu_backend="nvml")

    assert module.calls.count("nvmlInit") == 1
    assert module.calls.count("nvmlDeviceGetCount") == 2


def test_the_real_binding_on_this_machine_gives_gpus_or_a_reason(device: Device) -> None:
    backend = snapshot(device.glob, gpu_backend="auto")["gpu_backend"]

    if backend["available"]:  # a machine with an NVIDIA driver
        assert backend["name"] == "nvml"
    else:
        assert backend["name"] == "none"
        assert backend["reason"]
