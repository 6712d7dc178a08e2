"""A stand-in for nvidia-ml-py's `pynvml` module, for hosts without a GPU.

It raises the real binding's exception classes (pynvml.NVMLError and its
per-code subclasses, NVMLLibraryMismatchError), so the probe's handling of
errors is tested against what the real module throws. Functions can be made
absent (an older binding) or made to fail with FunctionNotFound (an older
driver), per name.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

NOT_AVAILABLE = 2**64 - 1


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * 1024**3
    used: int = 0
    reserved: int = 0  # driver-reserved: v2 memory info reports it apart from `used`
    utilization: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code it raises


def nvml_error(code: int) -> Exception:
    return real.NVMLError(code)


def fake_pynvml(gpus: Iterable[FakeGpu] = (), *, init_error: int | None = None, driver: str = "550.54.14",
                absent: Iterable[str] = (), function_not_found: Iterable[str] = (),
                errors: dict[str, int] | None = None) -> types.ModuleType:
    devices = list(gpus)
    module = types.ModuleType("pynvml")
    module.calls = []  # type: ignore[attr-defined]
    for name in dir(real):
        shared = name in ("NVMLLibraryMismatchError", "nvmlMemory_v2")
        if shared or name.startswith(("NVML_ERROR_", "NVMLError")):
            setattr(module, name, getattr(real, name))

    def api(name: str) -> Callable[[Callable[..., Any]], None]:
        def register(function: Callable[..., Any]) -> None:
            def called(*args: Any, **kwargs: Any) -> Any:
                module.calls.append(name)  # type: ignore[attr-defined]
                if name in set(function_not_found):
                    raise nvml_error(real.NVML_ERROR_FUNCTION_NOT_FOUND)
                if errors and name in errors:
                    raise nvml_error(errors[name])
                if args and isinstance(args[0], FakeGpu) and name in args[0].errors:
                    raise nvml_error(args[0].errors[name])
                return function(*args, **kwargs)

            setattr(module, name, called)
        return register

    @api("nvmlInit")
    def _init() -> None:
        if init_error is not None:
            raise nvml_error(init_error)

    @api("nvmlSystemGetDriverVersion")
    def _driver() -> str:
        return driver

    @api("nvmlDeviceGetCount")
    def _count() -> int:
        return len(devices)

    @api("nvmlDeviceGetHandleByIndex")
    def _handle(index: int) -> FakeGpu:
        gpu = devices[index]
        if "nvmlDeviceGetHandleByIndex" in gpu.errors:
            raise nvml_error(gpu.errors["nvmlDeviceGetHandleByIndex"])
        return gpu

    @api("nvmlDeviceGetUUID")
    def _uuid(gpu: FakeGpu) -> str:
        return gpu.uuid

    @api("nvmlDeviceGetName")
    def _name(gpu: FakeGpu) -> bytes:
        return gpu.name.encode()  # older bindings return bytes

    @api("nvmlDeviceGetMemoryInfo")
    def _memory(gpu: FakeGpu, version: int | None = None) -> types.SimpleNamespace:
        if version is not None:
            if "nvmlDeviceGetMemoryInfo_v2" in set(function_not_found):
                raise nvml_error(real.NVML_ERROR_FUNCTION_NOT_FOUND)
            return types.SimpleNamespace(total=gpu.total, used=gpu.used, reserved=gpu.reserved)
        return types.SimpleNamespace(total=gpu.total, used=gpu.used + gpu.reserved)

    @api("nvmlDeviceGetUtilizationRates")
    def _utilization(gpu: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=gpu.utilization, memory=0)

    for kind in ("Compute", "Graphics"):
        for suffix in ("_v3", "_v2", ""):
            def listing(gpu: FakeGpu, kind: str = kind) -> list[types.SimpleNamespace]:
                entries = gpu.compute if kind == "Compute" else gpu.graphics
                return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in entries]

            api(f"nvmlDeviceGet{kind}RunningProcesses{suffix}")(listing)

    for name in absent:
        delattr(module, name)
    return module
