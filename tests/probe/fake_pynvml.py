"""The real nvidia-ml-py over a simulated NVIDIA driver, for hosts without a GPU.

`fake_pynvml()` loads a fresh copy of the real `pynvml` module (the installed
one, or the file named by GPUADMIN_TEST_PYNVML to try another binding version)
and hands it a FakeDriver where it would load `libnvidia-ml.so.1`. Everything
the binding does is therefore the real binding's: None for unavailable memory,
the plain process-list names calling `_v3` (there is no v1 wrapper), `_v2`
wrappers only in bindings from 12.550, strict decoding of names, its exception
classes. Only the C library is simulated, as drivers differ:

- which functions it exports, by driver version (`exported_functions`);
- the process records it fills: 16 bytes for the plain name (v1), 24 for `_v2`,
  and for `_v3` 32 bytes on 535.43 to 535.86, 24 on every other driver;
- MIG: the parent handle lists processes only when `privileged`, each MIG
  device handle lists its own, per-process memory there is not available by
  default (NVML_VALUE_NOT_AVAILABLE);
- errors per function, per GPU, and a driver reload after which every call of
  the open session fails until NVML is shut down and initialised again;
- health: temperature, power, clock event reasons, ECC counts, remapped rows,
  retired pages (each NotSupported while its FakeGpu field is None), and XID
  events (`FakeDriver.xid`), queued on the event sets registered for the GPU
  before it happened, as the driver does.

C functions are plain Python callables here: ctypes passes them the binding's
ctypes objects unchanged, and they write their results into those.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import struct
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pynvml as installed

GiB = 1024**3
NOT_AVAILABLE = 2**64 - 1
NO_INSTANCE = 0xFFFFFFFF
BINDING_PATH = os.environ.get("GPUADMIN_TEST_PYNVML") or installed.__file__

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25

_ERROR_TEXT = {1: b"Uninitialized", 3: b"Not Supported", 4: b"Insufficient Permissions", 6: b"Not Found",
               9: b"Driver Not Loaded", 15: b"GPU is lost",
               18: b"RM has detected an NVML/RM version mismatch.", 999: b"Unknown Error"}


@dataclass
class FakeMig:
    """One MIG device (a compute instance of a GPU instance)."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    total: int = 10 * GiB
    used: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, memory); None: not available
    slot: int | None = None  # its index among the parent's MIG device handles (default: place in the list)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * GiB
    used: int = 0
    reserved: int = 0  # driver-reserved: v2 memory info reports it apart from `used`
    utilization: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    mps: list[tuple[int, int | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)  # C function name -> NVML error code it returns
    name_bytes: bytes | None = None  # the raw name, when it is not UTF-8
    mig: list[FakeMig] | None = None  # MIG on (with these devices) when not None
    mig_slots: int = 7
    # Health; None: the GPU answers NotSupported.
    temperature: int | None = None  # degrees Celsius
    power_mw: int | None = None
    power_limit_mw: int | None = None
    clock_reasons: int | None = None  # NVML's clocks event reasons mask
    ecc: dict[tuple[int, int], int] | None = None  # (error type, counter type) -> count
    remapped_rows: tuple[int, int, int, int] | None = None  # correctable, uncorrectable, pending, failure
    retired_pages: dict[int, int] | None = None  # cause -> pages retired for it
    retired_pages_pending: int | None = None
    # What a GPU reset checks (gpuadmin/probe/kill/reset.py); None: the GPU answers NotSupported.
    minor: int | None = None  # /dev/nvidia<minor>; its index when None
    persistence: int | None = None  # 1: persistence mode on
    virtualization: int | None = 0  # nvmlGpuVirtualizationMode_t: 0 bare metal, 1 passthrough
    # Per-process utilisation samples (pid, timeStamp in microseconds, smUtil), the driver's buffer:
    # those newer than the caller's lastSeenTimeStamp are returned. None: the GPU answers NotSupported.
    process_samples: list[tuple[int, int, int]] | None = None


# Functions that work without an open session.
_WITHOUT_SESSION = ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString")


def version_tuple(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    assert found, version
    return int(found.group(1)), int(found.group(2))


def exported_functions(version: str) -> set[str]:
    """What libnvidia-ml.so.1 of this driver version exports, as far as the probe cares.
    (Cut-offs within a branch are approximations; the tests name versions well inside them.)"""
    v = version_tuple(version)
    names = {
        "nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
        "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
    }
    if v >= (450, 0):
        names |= {
            "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2",
            "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
            "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceIsMigDeviceHandle",
        }
    if v >= (510, 47):
        names |= {
            "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2",
        }
    if v >= (535, 43):
        names.add("nvmlDeviceGetConfComputeMemSizeInfo")
    if v >= (535, 98):
        names.add("nvmlDeviceGetRunningProcessDetailList")
    names |= {
        "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait_v2", "nvmlEventSetFree",
    }
    names |= {
        "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetVirtualizationMode", "nvmlDeviceGetProcessUtilization",
    }
    if v >= (460, 0):
        names.add("nvmlDeviceGetRemappedRows")
    if v >= (535, 43):
        names.add("nvmlDeviceGetCurrentClocksEventReasons")
    return names


def record_bytes(function: str, version: str) -> int:
    """The size of the process records this driver's `function` fills."""
    if function.endswith("_v3"):
        return 32 if (535, 43) <= version_tuple(version) <= (535, 86) else 24
    if function.endswith("_v2"):
        return 24
    return 16


def pack_record(size: int, pid: int, memory: int | None, gpu_instance: int, compute_instance: int) -> bytes:
    used = NOT_AVAILABLE if memory is None else memory
    if size == 16:
        return struct.pack("=I4xQ", pid, used)
    if size == 24:
        return struct.pack("=I4xQII", pid, used, gpu_instance, compute_instance)
    return struct.pack("=I4xQIIQ", pid, used, gpu_instance, compute_instance, 0)


def _set(reference: Any, value: int) -> None:
    """Write through a byref() argument: a c_uint's value, or a handle (pointer) as an address."""
    target = reference._obj
    if isinstance(target, ctypes._Pointer):
        ctypes.c_void_p.from_buffer(target).value = value
    else:
        target.value = value


def _token(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class FakeDriver:
    """libnvidia-ml.so.1 of one driver version; attribute lookup is symbol lookup (AttributeError:
    not exported, which the binding turns into FunctionNotFound)."""

    def __init__(self, gpus: Iterable[FakeGpu] = (), *, version: str = "550.54.14",
                 init_error: int | None = None, missing: Iterable[str] = (),
                 errors: dict[str, int] | None = None, privileged: bool = False) -> None:
        self.gpus = list(gpus)
        self.version = version
        self.init_error = init_error
        self.symbols = exported_functions(version) - set(missing)
        self.errors = dict(errors or {})
        self.privileged = privileged
        self.calls: list[str] = []
        self.inits = 0
        self.shutdowns = 0
        self.overflows = 0  # fills that would have written past the caller's array on a real driver
        self._generation = 0
        self._session_generation: int | None = None
        self._stale_error = UNINITIALIZED
        # event set token -> (GPU indices registered for XID events, queued (GPU index, XID) events)
        self.event_sets: dict[int, tuple[set[int], list[tuple[int, int]]]] = {}
        # The lastSeenTimeStamp of each nvmlDeviceGetProcessUtilization call.
        self.utilization_asked_since: list[int] = []

    # --- what tests do to the driver ---

    def reload(self, *, error: int = UNINITIALIZED) -> None:
        """The kernel module was reloaded: the open session fails with `error` until re-initialised."""
        self._generation += 1
        self._stale_error = error

    def xid(self, gpu_index: int, xid: int) -> None:
        """The driver logged an XID for this GPU: every event set registered for it queues one event."""
        for gpus, queue in self.event_sets.values():
            if gpu_index in gpus:
                queue.append((gpu_index, xid))

    @property
    def initialised(self) -> bool:
        return self._session_generation is not None

    # --- symbol lookup ---

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in self.__dict__.get("symbols", ()):
            raise AttributeError(name)
        implementation = self._implementation(name)

        def c_function(*args: Any) -> Any:
            self.calls.append(name)
            if name not in _WITHOUT_SESSION:
                if self._session_generation is None:
                    return UNINITIALIZED
                if self._session_generation != self._generation:
                    return self._stale_error
                if name in self.errors:
                    return self.errors[name]
            return implementation(*args)

        return c_function

    def _implementation(self, name: str) -> Callable[..., Any]:
        if "RunningProcesses" in name:
            return lambda handle, count, array: self._processes(name, handle, count, array)
        simple = {
            "nvmlInit": self._init, "nvmlInit_v2": self._init,
            "nvmlInitWithFlags": lambda flags: self._init(),
            "nvmlShutdown": self._shutdown,
            "nvmlErrorString": lambda code: _ERROR_TEXT.get(code, b"Unknown Error"),
            "nvmlSystemGetDriverVersion": lambda buffer, size: self._string(buffer, self.version.encode()),
            "nvmlDeviceGetCount_v2": lambda count: self._out(count, len(self.gpus)),
            "nvmlDeviceGetHandleByIndex_v2": self._handle_by_index,
            "nvmlDeviceGetUUID": lambda handle, buffer, size: self._on(
                handle, "nvmlDeviceGetUUID", lambda d: self._string(buffer, d.uuid.encode())),
            "nvmlDeviceGetName": lambda handle, buffer, size: self._on(
                handle, "nvmlDeviceGetName", lambda d: self._string(buffer, self._name(d))),
            "nvmlDeviceGetMemoryInfo": lambda handle, memory: self._on(
                handle, "nvmlDeviceGetMemoryInfo", lambda d: self._memory(d, memory._obj, v2=False)),
            "nvmlDeviceGetMemoryInfo_v2": lambda handle, memory: self._on(
                handle, "nvmlDeviceGetMemoryInfo_v2", lambda d: self._memory(d, memory._obj, v2=True)),
            "nvmlDeviceGetUtilizationRates": lambda handle, out: self._on(
                handle, "nvmlDeviceGetUtilizationRates", lambda d: self._utilization(d, out._obj)),
            "nvmlDeviceGetHandleByUUID": self._handle_by_uuid,
            "nvmlDeviceGetIndex": lambda handle, out: self._on(
                handle, "nvmlDeviceGetIndex", lambda d: self._out(out, self._index(d))),
            "nvmlDeviceGetMinorNumber": lambda handle, out: self._on(
                handle, "nvmlDeviceGetMinorNumber",
                lambda d: self._out(out, d.minor if d.minor is not None else self._index(d))),
            "nvmlDeviceGetPersistenceMode": lambda handle, out: self._on(
                handle, "nvmlDeviceGetPersistenceMode",
                lambda d: NOT_SUPPORTED if d.persistence is None else self._out(out, d.persistence)),
            "nvmlDeviceGetVirtualizationMode": lambda handle, out: self._on(
                handle, "nvmlDeviceGetVirtualizationMode",
                lambda d: NOT_SUPPORTED if d.virtualization is None else self._out(out, d.virtualization)),
            "nvmlDeviceGetMigMode": lambda handle, current, pending: self._on(
                handle, "nvmlDeviceGetMigMode", lambda d: self._mig_mode(d, current, pending)),
            "nvmlDeviceGetMaxMigDeviceCount": lambda handle, count: self._on(
                handle, "nvmlDeviceGetMaxMigDeviceCount", lambda d: self._out(count, d.mig_slots)),
            "nvmlDeviceGetMigDeviceHandleByIndex": self._mig_handle,
            "nvmlDeviceGetGpuInstanceId": lambda handle, out: self._on_mig(
                handle, lambda m: self._out(out, m.gpu_instance_id)),
            "nvmlDeviceGetComputeInstanceId": lambda handle, out: self._on_mig(
                handle, lambda m: self._out(out, m.compute_instance_id)),
            "nvmlDeviceIsMigDeviceHandle": lambda handle, out: self._out(
                out, int(self._device(handle)[1] is not None)),
            "nvmlDeviceGetProcessUtilization": lambda handle, samples, count, since: self._on(
                handle, "nvmlDeviceGetProcessUtilization",
                lambda d: self._process_utilization(d, samples, count._obj, since.value)),
        }
        health: dict[str, Callable[..., Any]] = {
            "nvmlDeviceGetTemperature": lambda handle, sensor, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "temperature", None))),
            "nvmlDeviceGetPowerUsage": lambda handle, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "power_mw", None))),
            "nvmlDeviceGetEnforcedPowerLimit": lambda handle, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "power_limit_mw", None))),
            "nvmlDeviceGetCurrentClocksThrottleReasons": lambda handle, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "clock_reasons", None))),
            "nvmlDeviceGetCurrentClocksEventReasons": lambda handle, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "clock_reasons", None))),
            "nvmlDeviceGetTotalEccErrors": lambda handle, error, counter, out: self._on(
                handle, name, lambda d: self._ecc(d, error.value, counter.value, out)),
            "nvmlDeviceGetRemappedRows": lambda handle, *outs: self._on(
                handle, name, lambda d: self._remapped(d, outs)),
            "nvmlDeviceGetRetiredPages": lambda handle, cause, count, pages: self._on(
                handle, name, lambda d: self._retired(d, cause.value, count, pages)),
            "nvmlDeviceGetRetiredPagesPendingStatus": lambda handle, out: self._on(
                handle, name, lambda d: self._known(out, getattr(d, "retired_pages_pending", None))),
            "nvmlEventSetCreate": self._event_set_create,
            "nvmlDeviceRegisterEvents": self._register_events,
            "nvmlEventSetWait_v2": self._event_wait,
            "nvmlEventSetFree": lambda event_set: SUCCESS if self.event_sets.pop(_token(event_set), None)
            else INVALID_ARGUMENT,
        }
        if name in health:
            return health[name]
        return simple.get(name, lambda *args: NOT_SUPPORTED)

    # --- the C functions ---

    def _init(self) -> int:
        if self.init_error is not None:
            return self.init_error
        self.inits += 1
        self._session_generation = self._generation
        return SUCCESS

    def _shutdown(self) -> int:
        if self._session_generation is None:
            return UNINITIALIZED
        self.shutdowns += 1
        self._session_generation = None
        return SUCCESS

    @staticmethod
    def _out(reference: Any, value: int) -> int:
        _set(reference, value)
        return SUCCESS

    @staticmethod
    def _string(buffer: Any, data: bytes) -> int:
        buffer.value = data
        return SUCCESS

    @staticmethod
    def _name(device: FakeGpu | FakeMig) -> bytes:
        raw = getattr(device, "name_bytes", None)
        return raw if raw is not None else device.name.encode()

    def _device(self, handle: Any) -> tuple[FakeGpu | None, FakeMig | None]:
        token = _token(handle)
        index, slot = divmod(token - 0x1000, 0x100)
        if token < 0x1000 or index >= len(self.gpus):
            return None, None
        gpu = self.gpus[index]
        if slot == 0:
            return gpu, None
        return gpu, next((m for m in self._migs(gpu) if m[0] == slot - 1), (None, None))[1]

    @staticmethod
    def _migs(gpu: FakeGpu) -> list[tuple[int, FakeMig]]:
        return [(m.slot if m.slot is not None else i, m) for i, m in enumerate(gpu.mig or ())]

    def _on(self, handle: Any, name: str, run: Callable[[FakeGpu | FakeMig], int]) -> int:
        gpu, mig = self._device(handle)
        if gpu is None:
            return INVALID_ARGUMENT
        if mig is None:
            for key in (name, name.removesuffix("_v2")):  # an error for memory info: both variants fail
                if key in gpu.errors:
                    return gpu.errors[key]
        return run(mig if mig is not None else gpu)

    def _on_mig(self, handle: Any, run: Callable[[FakeMig], int]) -> int:
        _, mig = self._device(handle)
        return INVALID_ARGUMENT if mig is None else run(mig)

    def _handle_by_index(self, index: Any, handle: Any) -> int:
        i = index.value
        if i >= len(self.gpus):
            return INVALID_ARGUMENT
        if "nvmlDeviceGetHandleByIndex_v2" in self.gpus[i].errors:
            return self.gpus[i].errors["nvmlDeviceGetHandleByIndex_v2"]
        return self._out(handle, 0x1000 + 0x100 * i)

    def _handle_by_uuid(self, uuid: Any, handle: Any) -> int:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid.encode() == uuid.value:
                return self._out(handle, 0x1000 + 0x100 * i)
        return NOT_FOUND

    def _index(self, device: Any) -> int:
        return next(i for i, gpu in enumerate(self.gpus) if gpu is device)

    def _mig_handle(self, handle: Any, index: Any, out: Any) -> int:
        gpu, mig = self._device(handle)
        if gpu is None or mig is not None or gpu.mig is None:
            return INVALID_ARGUMENT
        slot = index.value
        if not any(s == slot for s, _ in self._migs(gpu)):
            return NOT_FOUND
        return self._out(out, _token(handle) + 1 + slot)

    def _memory(self, device: FakeGpu | FakeMig, memory: Any, *, v2: bool) -> int:
        reserved = getattr(device, "reserved", 0)
        if v2:
            if memory.version >> 24 != 2:
                return ARGUMENT_VERSION_MISMATCH
            memory.reserved = reserved
            memory.used = device.used
        else:
            memory.used = device.used + reserved
        memory.total = device.total
        memory.free = device.total - device.used - reserved
        return SUCCESS

    @staticmethod
    def _utilization(device: FakeGpu | FakeMig, out: Any) -> int:
        if isinstance(device, FakeMig) or device.mig is not None:
            return NOT_SUPPORTED
        out.gpu = device.utilization
        out.memory = 0
        return SUCCESS

    def _process_utilization(self, device: FakeGpu | FakeMig, samples: Any, count: Any, since: int) -> int:
        if isinstance(device, FakeMig) or device.mig is not None or device.process_samples is None:
            return NOT_SUPPORTED
        self.utilization_asked_since.append(since)
        newer = [s for s in device.process_samples if s[1] > since]
        if not newer:
            return NOT_FOUND  # what NVML answers when it holds no sample since then
        if samples is None or count.value < len(newer):
            count.value = len(newer)
            return INSUFFICIENT_SIZE
        for i, (pid, stamp, percent) in enumerate(newer):
            samples[i].pid, samples[i].timeStamp, samples[i].smUtil = pid, stamp, percent
            samples[i].memUtil = samples[i].encUtil = samples[i].decUtil = 0
        count.value = len(newer)
        return SUCCESS

    @staticmethod
    def _mig_mode(device: FakeGpu | FakeMig, current: Any, pending: Any) -> int:
        if isinstance(device, FakeMig):
            return INVALID_ARGUMENT
        mode = int(device.mig is not None)
        _set(current, mode)
        _set(pending, mode)
        return SUCCESS

    @staticmethod
    def _known(reference: Any, value: int | None) -> int:
        if value is None:
            return NOT_SUPPORTED
        _set(reference, value)
        return SUCCESS

    @staticmethod
    def _ecc(device: FakeGpu | FakeMig, error: int, counter: int, out: Any) -> int:
        ecc = getattr(device, "ecc", None)
        if ecc is None:
            return NOT_SUPPORTED  # ECC off, or a GPU without it
        _set(out, ecc.get((error, counter), 0))
        return SUCCESS

    @staticmethod
    def _remapped(device: FakeGpu | FakeMig, outs: tuple[Any, ...]) -> int:
        rows = getattr(device, "remapped_rows", None)
        if rows is None:
            return NOT_SUPPORTED  # before Ampere
        for out, value in zip(outs, rows, strict=True):
            _set(out, value)
        return SUCCESS

    @staticmethod
    def _retired(device: FakeGpu | FakeMig, cause: int, count_reference: Any, pages: Any) -> int:
        retired = getattr(device, "retired_pages", None)
        if retired is None:
            return NOT_SUPPORTED  # Ampere and later remap rows instead
        wanted = retired.get(cause, 0)
        count = count_reference._obj
        if pages is None or count.value < wanted:
            count.value = wanted
            return INSUFFICIENT_SIZE if wanted else SUCCESS
        for i in range(wanted):
            pages[i] = 0x1000 * (i + 1)
        count.value = wanted
        return SUCCESS

    def _event_set_create(self, out: Any) -> int:
        token = 0x9000 + len(self.event_sets) + 1
        while token in self.event_sets:
            token += 1
        self.event_sets[token] = (set(), [])
        return self._out(out, token)

    def _register_events(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu, _ = self._device(handle)
        if gpu is None or _token(event_set) not in self.event_sets:
            return INVALID_ARGUMENT
        if "nvmlDeviceRegisterEvents" in gpu.errors:
            return gpu.errors["nvmlDeviceRegisterEvents"]
        if types.value & 0x8:
            self.event_sets[_token(event_set)][0].add(self.gpus.index(gpu))
        return SUCCESS

    def _event_wait(self, event_set: Any, data: Any, timeout: Any) -> int:
        entry = self.event_sets.get(_token(event_set))
        if entry is None:
            return INVALID_ARGUMENT
        if not entry[1]:
            return TIMEOUT
        index, xid = entry[1].pop(0)
        event = data._obj
        ctypes.c_void_p.from_buffer(event, type(event).device.offset).value = 0x1000 + 0x100 * index
        event.eventType = 0x8
        event.eventData = xid
        event.gpuInstanceId = NO_INSTANCE
        event.computeInstanceId = NO_INSTANCE
        return SUCCESS

    def _processes(self, name: str, handle: Any, count_reference: Any, array: Any) -> int:
        gpu, mig = self._device(handle)
        if gpu is None:
            return INVALID_ARGUMENT
        base = name.removesuffix("_v2").removesuffix("_v3")
        if mig is None and base in gpu.errors:
            return gpu.errors[base]
        if mig is None and name in gpu.errors:
            return gpu.errors[name]
        kind = base.removeprefix("nvmlDeviceGet").removesuffix("RunningProcesses")
        entries: list[tuple[int, int | None, int, int]]
        if mig is not None:
            listed = mig.compute if kind == "Compute" else []
            entries = [(pid, used, mig.gpu_instance_id, mig.compute_instance_id) for pid, used in listed]
        elif gpu.mig is not None:
            # MIG on: the parent handle gives the instances' processes together, and only to root.
            if not self.privileged:
                return NO_PERMISSION
            entries = [(pid, used, m.gpu_instance_id, m.compute_instance_id)
                       for m in gpu.mig for pid, used in (m.compute if kind == "Compute" else [])]
        else:
            listed = {"Compute": gpu.compute, "Graphics": gpu.graphics, "MPSCompute": gpu.mps}[kind]
            entries = [(pid, used, NO_INSTANCE, NO_INSTANCE) for pid, used in listed]
        count = count_reference._obj
        if array is None or count.value < len(entries):
            count.value = len(entries)
            return INSUFFICIENT_SIZE if entries else SUCCESS
        size = record_bytes(name, self.version)
        raw = b"".join(pack_record(size, *entry) for entry in entries)
        capacity = ctypes.sizeof(array)
        if len(raw) > capacity:  # a real driver would write past the end of the caller's array
            self.overflows += 1
        ctypes.memmove(array, raw, min(len(raw), capacity))
        count.value = len(entries)
        return SUCCESS


@cache
def _binding_code(path: str) -> types.CodeType:
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), path, "exec")


def load_binding(driver: FakeDriver, *, without: Iterable[str] = ()) -> types.ModuleType:
    """A fresh copy of the real pynvml module that loads `driver` as its C library.
    `without`: binding functions to remove (an older binding that lacks them)."""
    spec = importlib.util.spec_from_file_location("pynvml", BINDING_PATH)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(_binding_code(BINDING_PATH), module.__dict__)  # the binding's own source, run as an import would

    def cdll(path: str, *args: Any, **kwargs: Any) -> FakeDriver:
        assert path == "libnvidia-ml.so.1", path
        return driver

    module.CDLL = cdll  # type: ignore[attr-defined]
    for name in without:
        if hasattr(module, name):  # bindings before 12.550 lack the _v2 wrappers already
            delattr(module, name)
    return module


def fake_pynvml(gpus: Iterable[FakeGpu] = (), *, without: Iterable[str] = (), **driver_options: Any
                ) -> types.ModuleType:
    """The real binding over a FakeDriver built from `gpus` and `driver_options`; the driver is `.driver`."""
    driver = FakeDriver(gpus, **driver_options)
    module = load_binding(driver, without=without)
    module.driver = driver  # type: ignore[attr-defined]
    return module
