"""The nvml backend against the real nvidia-ml-py over a simulated driver (tests/probe/fake_pynvml.py):
record sizes per driver version, MIG, errors of every kind, NVML's lifetime, and PIDs
that are impossible or that /proc does not know."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator

import pytest

from gpuadmin.probe.gpus import GpuHealth, nvml
from gpuadmin.probe.gpus.nvml_records import ProcessInfoV2, ProcessInfoV3Cc, choose_listing
from gpuadmin.probe.procfs import read_pid_max
from tests.probe import fake_pynvml as fake
from tests.probe.fake_pynvml import FakeGpu, FakeMig, GiB, fake_pynvml
from tests.probe.helpers import REPO, Device, Processes, free_pid, rows_by_pid, snapshot

Install = Callable[..., types.ModuleType]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """Put the real binding over a fake driver where `import pynvml` finds it, for this test only."""

    def put(*gpus: FakeGpu, **options: object) -> types.ModuleType:
        module = fake_pynvml(gpus, **options)  # type: ignore[arg-type]
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    yield put
    nvml.close()


def driver_of(module: types.ModuleType) -> fake.FakeDriver:
    return module.driver  # type: ignore[no-any-return]


# --- initialisation ----------------------------------------------------------


@pytest.mark.parametrize(("code", "reason"), [
    (fake.DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (fake.LIB_RM_VERSION_MISMATCH,
     "NVML library and kernel driver versions differ (reload the nvidia module or reboot)"),
    (999, "NVML initialisation failed: Unknown Error"),
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


def test_no_driver_library_at_all(monkeypatch: pytest.MonkeyPatch, device: Device) -> None:
    module = fake_pynvml()

    def no_library(path: str) -> None:
        raise OSError(f"{path}: cannot open shared object file")

    module.CDLL = no_library  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", module)

    backend = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]

    assert backend["reason"] == "NVML library not found (libnvidia-ml.so.1; is the NVIDIA driver installed?)"


def test_without_nvidia_ml_py_installed(monkeypatch: pytest.MonkeyPatch, device: Device) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail

    backend = snapshot(device.glob, gpu_backend="auto")["gpu_backend"]

    assert backend == {"name": "none", "available": False, "reason": "nvidia-ml-py (pynvml) is not installed"}


# --- process lists -------------------------------------------------------------


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
    # A GPU that says nothing of its health: every field unknown, none zero; XIDs watched, none seen.
    assert gpu0.pop("health") == {**dict.fromkeys(GpuHealth.__slots__), "xid_errors": []}
    assert gpu0 == {"index": 0, "uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB",
                    "memory_total_bytes": 80 * GiB, "memory_used_bytes": 30 * GiB, "utilization_percent": 88}
    assert gpu1["uuid"] == "GPU-1"
    rows = rows_by_pid(document)
    assert rows[trainer.pid]["gpu_memory_bytes"] == {"GPU-0": 20 * GiB}
    assert "mig_instances" not in rows[trainer.pid]
    assert rows[renderer.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert "gpu" in rows[renderer.pid]["reasons"]
    assert ghost not in rows
    assert document["unmatched_gpu_processes"] == [
        {"pid": ghost, "gpu_uuid": "GPU-0", "used_memory_bytes": 9 * GiB}
    ]


# driver version -> the C function that must be called and the record it fills
DRIVERS = [
    ("418.87.01", "nvmlDeviceGetComputeRunningProcesses", 16),  # before _v2
    ("470.82.01", "nvmlDeviceGetComputeRunningProcesses_v2", 24),  # r470: no _v3
    ("515.65.01", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ("535.43.02", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
    ("535.54.03", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
    ("535.86.10", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
    ("535.98", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ("535.104.05", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ("550.54.14", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ("580.65.06", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
]


@pytest.mark.parametrize(("driver", "function", "record_bytes"), DRIVERS)
def test_every_driver_gives_the_right_pids_and_memory(
    install: Install, processes: Processes, device: Device, *, driver: str, function: str, record_bytes: int
) -> None:
    first, second, third = (processes.start("sleeper") for _ in range(3))
    ghost = free_pid()
    listed = [(first.pid, GiB), (second.pid, 2 * GiB), (third.pid, None), (ghost, 3 * GiB)]
    module = install(FakeGpu("GPU-0", used=6 * GiB, compute=listed), version=driver)
    assert fake.record_bytes(function, driver) == record_bytes

    document = snapshot(device.glob, gpu_backend="nvml")

    rows = rows_by_pid(document)
    assert {pid: rows[pid]["gpu_memory_bytes"] for pid in (first.pid, second.pid, third.pid)} == {
        first.pid: {"GPU-0": GiB}, second.pid: {"GPU-0": 2 * GiB}, third.pid: {"GPU-0": None},
    }
    assert document["unmatched_gpu_processes"] == [
        {"pid": ghost, "gpu_uuid": "GPU-0", "used_memory_bytes": 3 * GiB}
    ]
    assert document["gpu_backend"]["reason"] is None
    calls = driver_of(module).calls
    assert function in calls
    assert not any(c.startswith("nvmlDeviceGetComputeRunningProcesses") and c != function for c in calls)
    assert driver_of(module).overflows == 0


def test_the_bindings_own_wrapper_misreads_where_record_sizes_differ(install: Install) -> None:
    """What the fake reproduces, and why the backend does not use the binding's wrapper."""
    binding_bytes = ctypes.sizeof(fake_pynvml().c_nvmlProcessInfo_t)
    driver = "535.54.03" if binding_bytes == 24 else "550.54.14"  # a driver that fills the other size
    module = install(FakeGpu("GPU-0", compute=[(1000, GiB), (1001, GiB), (1002, GiB)]), version=driver)
    module.nvmlInit()

    read = module.nvmlDeviceGetComputeRunningProcesses(module.nvmlDeviceGetHandleByIndex(0))

    pids = [p.pid for p in read]
    if binding_bytes == 24:  # the reproduction: (1000, 1 GiB), (0, 1001), (4294967295, 0)
        assert [(p.pid, p.usedGpuMemory) for p in read] == [(1000, GiB), (0, 1001), (4294967295, 0)]
    assert pids != [1000, 1001, 1002]


def test_an_old_binding_without_v2_wrappers_on_an_r470_driver(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    # nvidia-ml-py before 12.550 has no _v2 wrappers; 12.535.77's record type is the 32-byte one.
    module = install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)]), version="470.82.01",
                     without=[f"nvmlDeviceGet{kind}RunningProcesses_v2"
                              for kind in ("Compute", "Graphics", "MPSCompute")])
    module.c_nvmlProcessInfo_t = ProcessInfoV3Cc  # type: ignore[attr-defined]
    module.c_nvmlProcessInfo_v3_t = ProcessInfoV3Cc  # type: ignore[attr-defined]

    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert document["gpu_backend"]["reason"] is None


def test_a_driver_without_any_process_list_says_so(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0"), version="418.87.01",
            missing=["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"])

    backend = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]

    assert backend["available"] is True
    assert backend["reason"] == ("GPU 0 compute processes: not supported by this driver; "
                                 "GPU 0 graphics processes: not supported by this driver")


@pytest.mark.parametrize(("version", "symbols", "record"), [
    ("", {"_v3", "nvmlDeviceGetConfComputeMemSizeInfo"}, ProcessInfoV3Cc),
    ("", {"_v3", "nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetRunningProcessDetailList"},
     ProcessInfoV2),
    ("r535 beta", {"_v3"}, ProcessInfoV2),
])
def test_an_unreadable_driver_version_is_decided_by_the_symbols(
    version: str, symbols: set[str], record: type[ctypes.Structure]
) -> None:
    exported = {s if not s.startswith("_") else f"nvmlDeviceGetComputeRunningProcesses{s}" for s in symbols}

    listing = choose_listing("Compute", version, exported.__contains__)

    assert listing is not None and listing.record is record


def test_impossible_pids_are_dropped_with_a_reason(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    ghost = free_pid()
    pid_max = read_pid_max()
    install(FakeGpu("GPU-0"), FakeGpu("GPU-1", compute=[
        (worker.pid, GiB), (0, 5), (0xFFFFFFFF, 0), (pid_max, GiB), (ghost, GiB),
    ]))

    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-1": GiB}
    assert [u["pid"] for u in document["unmatched_gpu_processes"]] == [ghost]
    assert document["gpu_backend"]["reason"] == (
        f"GPU 1: dropped impossible PIDs 0, {pid_max}, 4294967295 "
        f"(pid_max {pid_max}; misread process records?)"
    )


def test_process_lists_of_one_process_in_several_lists_count_it_once(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)], graphics=[(worker.pid, GiB)],
                    mps=[(worker.pid, None)]))

    document = snapshot(device.glob, gpu_backend="nvml")

    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}


@pytest.mark.parametrize("code", [fake.NOT_SUPPORTED, None])
def test_mps_not_supported_or_absent_is_silent(install: Install, device: Device, code: int | None) -> None:
    if code is None:
        install(FakeGpu("GPU-0"), version="418.87.01")  # no MPS list at all
    else:
        install(FakeGpu("GPU-0", errors={"nvmlDeviceGetMPSComputeRunningProcesses": code}))

    assert snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]["reason"] is None


def test_other_mps_errors_are_reported(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", errors={"nvmlDeviceGetMPSComputeRunningProcesses": fake.NO_PERMISSION}))

    reason = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]["reason"]

    assert reason == "GPU 0 mpscompute processes: Insufficient Permissions"


# --- per-process utilisation ----------------------------------------------------


def microseconds_ago(seconds: float) -> int:
    return (time.time_ns() // 1000) - int(seconds * 1_000_000)


def test_each_process_gets_its_latest_sm_utilisation_sample_where_the_gpu_gives_one(
    install: Install, processes: Processes, device: Device
) -> None:
    trainer, renderer, quiet, old = (processes.start("sleeper") for _ in range(4))
    ghost = free_pid()
    module = install(
        FakeGpu("GPU-0", utilization=80, compute=[(trainer.pid, GiB), (ghost, GiB)],
                graphics=[(renderer.pid, GiB)],
                process_samples=[
                    (trainer.pid, microseconds_ago(6), 60), (trainer.pid, microseconds_ago(1), 75),
                    (renderer.pid, microseconds_ago(2), 5), (ghost, microseconds_ago(2), 50),
                    # A sample the driver could not fill is no figure; the one before it stands.
                    (renderer.pid, microseconds_ago(1), 0xFFFFFFFF),
                    # Older than about one probe interval: not asked for.
                    (old.pid, microseconds_ago(30), 90),
                ]),
        FakeGpu("GPU-1", compute=[(quiet.pid, GiB)], process_samples=[]),  # no sample: NotFound
        FakeGpu("GPU-2", compute=[(old.pid, GiB)]),  # NotSupported
    )

    document = snapshot(device.glob, gpu_backend="nvml")

    assert document["gpu_backend"]["reason"] is None
    rows = rows_by_pid(document)
    assert rows[trainer.pid]["gpu_utilization_percent"] == {"GPU-0": 75}
    assert rows[renderer.pid]["gpu_utilization_percent"] == {"GPU-0": 5}
    assert "gpu_utilization_percent" not in rows[quiet.pid]
    assert "gpu_utilization_percent" not in rows[old.pid]
    asked = driver_of(module).utilization_asked_since
    assert len(asked) == 3  # each GPU once
    assert all(abs(since - microseconds_ago(nvml.PROCESS_UTILIZATION_FIRST_SECONDS)) < 5_000_000
               for since in asked)
    # The next reading asks since this one: a sample newer than it is the figure.
    driver_of(module).gpus[1].process_samples = [(quiet.pid, microseconds_ago(0), 12)]
    again = snapshot(device.glob, gpu_backend="nvml")
    assert rows_by_pid(again)[quiet.pid]["gpu_utilization_percent"] == {"GPU-1": 12}
    assert asked[3] > asked[0] + (nvml.PROCESS_UTILIZATION_FIRST_SECONDS - 5) * 1_000_000


@pytest.mark.parametrize(("options", "reason"), [
    ({"errors": {"nvmlDeviceGetProcessUtilization": fake.NO_PERMISSION}},
     "GPU 0 process utilization: Insufficient Permissions"),
    ({"errors": {"nvmlDeviceGetProcessUtilization": fake.NOT_SUPPORTED}}, None),
    ({"missing": ["nvmlDeviceGetProcessUtilization"]}, None),  # a driver without it
])
def test_a_gpu_without_per_process_utilisation_costs_only_the_figure(
    install: Install, processes: Processes, device: Device, options: dict[str, object], reason: str | None
) -> None:
    worker = processes.start("sleeper")
    install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)],
                    process_samples=[(worker.pid, microseconds_ago(1), 40)]), **options)

    document = snapshot(device.glob, gpu_backend="nvml")

    assert document["gpu_backend"]["reason"] == reason
    row = rows_by_pid(document)[worker.pid]
    assert row["gpu_memory_bytes"] == {"GPU-0": GiB}
    assert "gpu_utilization_percent" not in row


# --- MIG -----------------------------------------------------------------------


def test_mig_processes_are_listed_per_instance_under_the_parent_gpu(
    install: Install, processes: Processes, device: Device
) -> None:
    small, big, both = (processes.start("sleeper") for _ in range(3))
    ghost = free_pid()
    install(
        FakeGpu("GPU-0", compute=[(small.pid, GiB)]),
        FakeGpu("GPU-1", used=12 * GiB, mig=[
            FakeMig(1, 0, "MIG-1", total=10 * GiB, used=3 * GiB,
                    compute=[(small.pid, None), (both.pid, None)]),
            FakeMig(2, 0, "MIG-2", name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", total=40 * GiB, used=9 * GiB,
                    compute=[(big.pid, None), (both.pid, None), (ghost, None)], slot=3),
        ]),
        version="535.104.05",
    )

    document = snapshot(device.glob, gpu_backend="nvml")

    # The parent's process lists (NoPermission without root) were not asked.
    assert document["gpu_backend"]["reason"] is None
    gpu1 = document["gpus"][1]
    assert gpu1["utilization_percent"] is None and gpu1["memory_used_bytes"] == 12 * GiB
    assert gpu1["mig_instances"] == [
        {"uuid": "MIG-1", "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "gpu_instance_id": 1,
         "compute_instance_id": 0, "memory_total_bytes": 10 * GiB, "memory_used_bytes": 3 * GiB},
        {"uuid": "MIG-2", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "gpu_instance_id": 2,
         "compute_instance_id": 0, "memory_total_bytes": 40 * GiB, "memory_used_bytes": 9 * GiB},
    ]
    assert "mig_instances" not in document["gpus"][0]
    rows = rows_by_pid(document)
    assert rows[small.pid]["gpu_memory_bytes"] == {"GPU-0": GiB, "GPU-1": None}
    assert rows[small.pid]["mig_instances"] == [
        {"gpu_uuid": "GPU-1", "gpu_instance_id": 1, "compute_instance_id": 0, "used_memory_bytes": None},
    ]
    assert [(i["gpu_instance_id"], i["compute_instance_id"]) for i in rows[both.pid]["mig_instances"]] == [
        (1, 0), (2, 0),
    ]
    assert document["unmatched_gpu_processes"] == [{
        "pid": ghost, "gpu_uuid": "GPU-1", "used_memory_bytes": None, "gpu_instance_id": 2,
        "compute_instance_id": 0,
    }]


def test_mig_memory_per_process_where_the_driver_gives_it(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    install(FakeGpu("GPU-0", mig=[
        FakeMig(1, 0, "MIG-1", compute=[(worker.pid, GiB)]),
        FakeMig(1, 1, "MIG-1b", compute=[(worker.pid, 2 * GiB)]),
    ]))

    row = rows_by_pid(snapshot(device.glob, gpu_backend="nvml"))[worker.pid]

    assert row["gpu_memory_bytes"] == {"GPU-0": 3 * GiB}
    assert [i["used_memory_bytes"] for i in row["mig_instances"]] == [GiB, 2 * GiB]


def test_mig_on_without_instances(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", mig=[]))

    document = snapshot(device.glob, gpu_backend="nvml")

    assert document["gpus"][0]["mig_instances"] == []
    assert document["gpu_backend"]["reason"] is None


# --- errors ----------------------------------------------------------------------


def test_per_device_errors_become_nulls_and_reasons(install: Install, device: Device) -> None:
    install(
        FakeGpu("GPU-0", errors={"nvmlDeviceGetUtilizationRates": fake.NOT_SUPPORTED}),
        FakeGpu("GPU-1", errors={"nvmlDeviceGetMemoryInfo": fake.NO_PERMISSION,
                                 "nvmlDeviceGetComputeRunningProcesses_v3": fake.NO_PERMISSION}),
        FakeGpu("GPU-2", errors={"nvmlDeviceGetHandleByIndex_v2": 999}),
    )

    document = snapshot(device.glob, gpu_backend="nvml")

    gpu0, gpu1, gpu2 = document["gpus"]
    assert gpu0["utilization_percent"] is None and gpu0["memory_total_bytes"] == 80 * GiB
    assert gpu1["memory_total_bytes"] is None and gpu1["memory_used_bytes"] is None
    assert gpu2 == {"index": 2, "uuid": "GPU-unknown-index-2", "name": "", "memory_total_bytes": None,
                    "memory_used_bytes": None, "utilization_percent": None}
    backend = document["gpu_backend"]
    assert backend["available"] is True
    assert backend["reason"] == (
        "GPU 0 utilization: Not Supported; GPU 1 memory: Insufficient Permissions; "
        "GPU 1 compute processes: Insufficient Permissions; GPU 2 handle: Unknown Error"
    )


def test_a_name_that_is_not_utf8_costs_the_name_not_the_snapshot(
    install: Install, processes: Processes, device: Device
) -> None:
    worker = processes.start("sleeper")
    install(FakeGpu("GPU-0", name_bytes=b"Tesla \xff\xfe", compute=[(worker.pid, GiB)]))

    document = snapshot(device.glob, gpu_backend="nvml")

    assert document["gpus"][0]["name"] == ""
    assert document["gpu_backend"]["reason"].startswith("GPU 0 name: UnicodeDecodeError: 'utf-8' codec")
    assert rows_by_pid(document)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}


def test_a_surprise_outside_the_call_wrapper_still_gives_a_snapshot(install: Install, device: Device) -> None:
    module = install(FakeGpu("GPU-0"))
    module.nvmlDeviceGetCount = lambda: "two"  # type: ignore[attr-defined] - a binding that changed its types

    document = snapshot(device.glob, gpu_backend="nvml")

    assert document["gpu_backend"]["available"] is False
    assert document["gpu_backend"]["reason"].startswith("NVML backend failed: TypeError")
    assert document["processes"] is not None and document["process_counts"]["total"] > 0


def test_no_device_count_means_no_gpu_data(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0"), errors={"nvmlDeviceGetCount_v2": 999})

    backend = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]

    assert backend == {"name": "nvml", "available": False, "reason": "device count: Unknown Error"}


def test_memory_info_v2_leaves_driver_reserved_memory_out(install: Install, device: Device) -> None:
    install(FakeGpu("GPU-0", used=4 * GiB, reserved=GiB))
    assert snapshot(device.glob, gpu_backend="nvml")["gpus"][0]["memory_used_bytes"] == 4 * GiB

    install(FakeGpu("GPU-0", used=4 * GiB, reserved=GiB), version="470.82.01")  # no memory info v2
    assert snapshot(device.glob, gpu_backend="nvml")["gpus"][0]["memory_used_bytes"] == 5 * GiB


# --- lifetime ----------------------------------------------------------------------


def test_nvml_is_initialised_once_and_kept_between_reads(install: Install, device: Device) -> None:
    module = install(FakeGpu("GPU-0", errors={"nvmlDeviceGetUtilizationRates": fake.NOT_SUPPORTED}))

    snapshot(device.glob, gpu_backend="nvml")
    snapshot(device.glob, gpu_backend="nvml")

    assert driver_of(module).inits == 1 and driver_of(module).shutdowns == 0
    assert driver_of(module).calls.count("nvmlDeviceGetCount_v2") == 2


@pytest.mark.parametrize("code", [
    fake.UNINITIALIZED, fake.DRIVER_NOT_LOADED, fake.LIB_RM_VERSION_MISMATCH, fake.GPU_IS_LOST,
])
def test_after_a_driver_level_error_nvml_is_initialised_again(
    install: Install, processes: Processes, device: Device, code: int
) -> None:
    worker = processes.start("sleeper")
    module = install(FakeGpu("GPU-0", compute=[(worker.pid, GiB)]))
    snapshot(device.glob, gpu_backend="nvml")
    driver_of(module).reload(error=code)

    failed = snapshot(device.glob, gpu_backend="nvml")
    again = snapshot(device.glob, gpu_backend="nvml")

    assert failed["gpu_backend"]["available"] is False
    assert failed["gpu_backend"]["reason"].startswith("driver version: ")
    assert driver_of(module).inits == 2 and driver_of(module).shutdowns == 1
    assert again["gpu_backend"] == {"name": "nvml", "available": True, "reason": None}
    assert rows_by_pid(again)[worker.pid]["gpu_memory_bytes"] == {"GPU-0": GiB}


def test_a_driver_that_stays_away_is_tried_again_at_each_read(install: Install, device: Device) -> None:
    module = install(FakeGpu("GPU-0"))
    snapshot(device.glob, gpu_backend="nvml")
    driver_of(module).reload(error=fake.DRIVER_NOT_LOADED)
    driver_of(module).init_error = fake.DRIVER_NOT_LOADED

    snapshot(device.glob, gpu_backend="nvml")
    away = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]
    driver_of(module).init_error = None
    back = snapshot(device.glob, gpu_backend="nvml")["gpu_backend"]

    assert away == {"name": "nvml", "available": False, "reason": "NVIDIA driver not loaded"}
    assert back["available"] is True


def test_nvml_is_shut_down_at_exit(tmp_path: object) -> None:
    script = textwrap.dedent("""
        import atexit, sys
        from tests.probe.fake_pynvml import FakeGpu, fake_pynvml
        module = fake_pynvml([FakeGpu("GPU-0")])
        sys.modules["pynvml"] = module
        # Registered first, so it runs after the probe's own exit handler.
        atexit.register(lambda: print("inits", module.driver.inits, "shutdowns", module.driver.shutdowns,
                                      "open", module.driver.initialised))
        from gpuadmin.probe.gpus import GpuHealth, nvml
        assert nvml.read().available
    """)

    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=60)

    assert done.stdout.strip() == "inits 1 shutdowns 1 open False"


# --- the agent and the device files ----------------------------------------------


def test_the_agent_and_its_pool_siblings_are_no_device_holders(processes: Processes, device: Device) -> None:
    """A worker pool: the parent forks two processes; one keeps the device open (as an NVML
    session does), the other takes the snapshot. An unrelated holder is still listed."""
    outsider = processes.start("holder", device.path)
    script = textwrap.dedent(f"""
        import json, os, sys, time
        from gpuadmin.probe.config import ProbeConfig
        from gpuadmin.probe.snapshot import take_snapshot
        read_end, write_end = os.pipe()
        holder = os.fork()
        if holder == 0:
            device = open({device.path!r})
            os.write(write_end, b"x")
            time.sleep(60)
            os._exit(0)
        os.read(read_end, 1)
        prober = os.fork()
        if prober == 0:
            keep = open({device.path!r})  # the probing process holds it too, as its NVML does
            document = take_snapshot(ProbeConfig(device_glob={device.glob!r}, gpu_backend="none"))
            holders = sorted(r["pid"] for r in document["processes"] if r["device_files"])
            print(json.dumps({{"holders": holders, "me": os.getpid(), "sibling": holder}}), flush=True)
            os._exit(0)
        os.waitpid(prober, 0)
        os.kill(holder, 9)
        os.waitpid(holder, 0)
    """)

    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=60)

    seen = json.loads(done.stdout)
    assert outsider.pid in seen["holders"]
    assert seen["me"] not in seen["holders"] and seen["sibling"] not in seen["holders"]


def test_the_real_binding_on_this_machine_gives_gpus_or_a_reason(device: Device) -> None:
    backend = snapshot(device.glob, gpu_backend="auto")["gpu_backend"]

    if backend["available"]:  # a machine with an NVIDIA driver
        assert backend["name"] == "nvml"
    else:
        assert backend["name"] == "none"
        assert backend["reason"]


# --- a GPU reset's checks (gpuadmin/probe/kill/reset.py) over NVML ------------


def test_reset_facts_read_the_gpu_by_uuid(install: Install) -> None:
    install(FakeGpu("GPU-0"), FakeGpu("GPU-1", minor=3, persistence=1, virtualization=1),
            FakeGpu("GPU-2", mig=[FakeMig(1, 0, "MIG-1"), FakeMig(2, 0, "MIG-2")], persistence=None))

    facts = nvml.reset_facts("GPU-1")
    mig = nvml.reset_facts("GPU-2")

    assert facts is not None and mig is not None
    assert (facts.index, facts.device_path, facts.persistence_mode, facts.virtualization) == (
        1, "/dev/nvidia3", True, "passthrough")
    assert (mig.index, mig.device_path, mig.mig_instances, mig.persistence_mode) == (
        2, "/dev/nvidia2", 2, None)
    assert nvml.reset_facts("GPU-elsewhere") is None


def test_a_reset_over_nvml_is_refused_for_a_vm_a_holder_and_a_host_without_nvidia_smi(
    install: Install, processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuadmin.probe.config import ProbeConfig
    from gpuadmin.probe.kill.reset import reset_gpu

    worker = processes.start("sleeper")
    install(FakeGpu("GPU-vm", virtualization=1), FakeGpu("GPU-busy", compute=[(worker.pid, GiB)]),
            FakeGpu("GPU-idle", persistence=0))
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi here
    config = ProbeConfig(gpu_backend="nvml", host_name="testhost")

    vm, busy, idle = (reset_gpu(uuid, config) for uuid in ("GPU-vm", "GPU-busy", "GPU-idle"))

    assert vm.fields["reason"] == "virtual_machine" and "passthrough GPU: not allowed" in vm.detail
    assert busy.fields["reason"] == "gpu_held" and f"held by pid {worker.pid} (" in busy.detail
    assert idle.fields["reason"] == "driver_refused"
    assert "the driver refused: nvidia-smi is not installed on this host" in idle.detail
