"""GPUs and their processes through NVML (NVIDIA's nvidia-ml-py, imported as pynvml).

pynvml is imported only when this backend is used, and initialised once per
process (NVML keeps a reference count; an agent reads it every few seconds).
Every NVML call goes through NvmlCalls: a function the driver or the binding
lacks falls back to the older variant (v3 -> v2 -> v1, as older drivers need),
and any other NVML error becomes a missing value (None) plus a line in the
backend's reason. Nothing else in the probe catches NVML errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from gpuadmin.probe.gpus import Gpu, GpuProcess, GpuState, unavailable

BACKEND = "nvml"
REASON_MAX_CHARS = 1024
# NVML_VALUE_NOT_AVAILABLE for unsigned long long fields: what old drivers report for
# per-process memory they cannot see (WDDM, some containers); newer pynvml maps it to None.
VALUE_NOT_AVAILABLE = 2**64 - 1
PROCESS_LISTS = ("Compute", "Graphics", "MPSCompute")

# NVML error codes (nvml.h) whose meaning we explain in words of our own.
_INIT_REASONS = {
    9: "NVIDIA driver not loaded",
    12: "NVML library not found (libnvidia-ml.so.1; is the NVIDIA driver installed?)",
    4: "no permission to use NVML",
    18: "NVML library and kernel driver versions differ (reload the nvidia module or reboot)",
}
_FUNCTION_NOT_FOUND = 13

_initialised: ModuleType | None = None

Variant = tuple[str, tuple[Any, ...], dict[str, Any]]


class NvmlUnavailable(Exception):
    pass


class NvmlCalls:
    """The one place NVML errors are handled."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.errors: list[str] = []
        self._error_types = tuple(
            t for t in (getattr(nvml, "NVMLError", None), getattr(nvml, "NVMLLibraryMismatchError", None))
            if isinstance(t, type) and issubclass(t, BaseException)
        )

    def first(self, what: str, variants: Sequence[Variant], *, optional: bool = False) -> Any | None:
        """The result of the first variant this NVML has; None when NVML says no
        (or, unless optional, when it has none of them)."""
        for name, args, kwargs in variants:
            function = getattr(self.nvml, name, None)
            if function is None:
                continue
            try:
                return function(*args, **kwargs)
            except self._error_types as exc:
                if self._function_missing(exc):
                    continue
                self.errors.append(f"{what}: {exc}")
                return None
        if not optional:
            self.errors.append(f"{what}: not supported by this driver")
        return None

    def call(self, what: str, name: str, *args: Any) -> Any | None:
        return self.first(what, [(name, args, {})])

    def versions(self, what: str, name: str, *args: Any, optional: bool = False) -> Any | None:
        """name_v3, then name_v2, then plain name (v1)."""
        variants = [(f"{name}_v3", args, {}), (f"{name}_v2", args, {}), (name, args, {})]
        return self.first(what, variants, optional=optional)

    def _function_missing(self, exc: BaseException) -> bool:
        # Unversioned pynvml functions turn FunctionNotFound into NVMLLibraryMismatchError.
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and isinstance(exc, mismatch):
            return True
        code = getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND)
        return getattr(exc, "value", None) == code

    def reason(self) -> str | None:
        if not self.errors:
            return None
        text = "; ".join(dict.fromkeys(self.errors))
        return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 1] + "…"


def _initialised_nvml() -> ModuleType:
    global _initialised  # noqa: PLW0603 - NVML is process-wide state; init it once per process
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
    if _initialised is not pynvml:
        try:
            pynvml.nvmlInit()
        # Whatever a broken driver install throws, the process half of the snapshot must still go out.
        except Exception as exc:
            code = getattr(exc, "value", None)
            raise NvmlUnavailable(_INIT_REASONS.get(code) or f"NVML initialisation failed: {exc}") from exc
        _initialised = pynvml
    return pynvml


def read() -> GpuState:
    try:
        nvml = _initialised_nvml()
    except NvmlUnavailable as exc:
        return unavailable(BACKEND, str(exc))
    calls = NvmlCalls(nvml)
    driver_version = _text(calls.call("driver version", "nvmlSystemGetDriverVersion"))
    count = calls.call("device count", "nvmlDeviceGetCount")
    if count is None:
        return GpuState(backend=BACKEND, available=False, reason=calls.reason(),
                        driver_version=driver_version)
    gpus: list[Gpu] = []
    memory_by_holder: dict[tuple[int, str], int | None] = {}
    for index in range(count):
        gpu, holders = _read_device(calls, index)
        gpus.append(gpu)
        for pid, used in holders:
            key = (pid, gpu.uuid)
            # A process can sit in several lists (compute and graphics): count it once.
            if key not in memory_by_holder or (used or 0) > (memory_by_holder[key] or 0):
                memory_by_holder[key] = used
    processes = tuple(GpuProcess(pid, uuid, used) for (pid, uuid), used in memory_by_holder.items())
    return GpuState(backend=BACKEND, available=True, reason=calls.reason(), gpus=tuple(gpus),
                    processes=processes, driver_version=driver_version)


def _read_device(calls: NvmlCalls, index: int) -> tuple[Gpu, list[tuple[int, int | None]]]:
    nvml = calls.nvml
    placeholder_uuid = f"GPU-unknown-index-{index}"
    handle = calls.call(f"GPU {index} handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return Gpu(index, placeholder_uuid, "", None, None, None), []
    uuid = _text(calls.call(f"GPU {index} uuid", "nvmlDeviceGetUUID", handle)) or placeholder_uuid
    name = _text(calls.call(f"GPU {index} name", "nvmlDeviceGetName", handle)) or ""
    memory_variants: list[Variant] = []
    if hasattr(nvml, "nvmlMemory_v2"):
        # v2 reports driver-reserved memory apart from `used`; that memory belongs to no process.
        memory_variants.append(("nvmlDeviceGetMemoryInfo", (handle,), {"version": nvml.nvmlMemory_v2}))
    memory_variants.append(("nvmlDeviceGetMemoryInfo", (handle,), {}))
    memory = calls.first(f"GPU {index} memory", memory_variants)
    utilization = calls.call(f"GPU {index} utilization", "nvmlDeviceGetUtilizationRates", handle)
    holders: list[tuple[int, int | None]] = []
    for kind in PROCESS_LISTS:
        listed = calls.versions(f"GPU {index} {kind.lower()} processes",
                                f"nvmlDeviceGet{kind}RunningProcesses", handle, optional=kind == "MPSCompute")
        for info in listed or ():
            holders.append((int(info.pid), _bytes(getattr(info, "usedGpuMemory", None))))
    gpu = Gpu(
        index=index,
        uuid=uuid[:128],
        name=name[:256],
        memory_total_bytes=_bytes(getattr(memory, "total", None)),
        memory_used_bytes=_bytes(getattr(memory, "used", None)),
        utilization_percent=_percent(getattr(utilization, "gpu", None)),
    )
    return gpu, holders


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _bytes(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    number = int(value)
    return None if number < 0 or number >= VALUE_NOT_AVAILABLE else number


def _percent(value: Any) -> int | None:
    number = _bytes(value)
    return number if number is not None and number <= 100 else None
