"""GPUs and their processes through NVML (NVIDIA's nvidia-ml-py, imported as pynvml).

pynvml is imported only when this backend is used. Every NVML call goes
through NvmlCalls, the one place errors are handled: a function the driver or
the binding lacks falls back to the older variant, and any exception — an
NVMLError, or anything else the binding throws, such as a UnicodeDecodeError
from its strict decoding of a name — becomes a missing value (None) plus a
line in the backend's reason. A snapshot is never lost to the GPU half.

Process lists are read by nvml_records with record types sized for the
driver, not by the binding's wrappers (see there why). With MIG on, each MIG
device handle is asked for its processes, which are reported under the parent
GPU with the GPU instance and compute instance ids.

Each GPU's own processes' utilisation is NVML's latest per-process sample
(nvmlDeviceGetProcessUtilization) since this process's previous reading of the
GPU; a GPU or driver without it, or no sample, is no figure, never an error.

Each GPU's health (temperature, power, clock event reasons, ECC, remapped rows
or retired pages, XID events) is read by nvml_health, through the same
NvmlCalls; its XID event set lives with the session.

Lifetime: NVML is initialised on the first read in a process and kept open
between reads (nvmlInit wakes every GPU and can take seconds on big machines
without persistence mode; docs/snapshot.md). It is shut down at exit, and shut
down after a driver-level error (driver unloaded or reloaded, GPU lost) so the
next read initialises it again instead of repeating the error forever.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Collection
from functools import partial
from types import ModuleType
from typing import Any, cast

from gpuadmin.probe.gpus import (
    Gpu,
    GpuProcess,
    GpuResetFailed,
    GpuState,
    MigInstance,
    ProcessUtilization,
    ResetFacts,
    join_reasons,
    unavailable,
)
from gpuadmin.probe.gpus.nvml_health import XidWatch, read_health
from gpuadmin.probe.gpus.nvml_records import Listing, ProcessRecord, choose_listing, list_processes

BACKEND = "nvml"
PROCESS_LISTS = ("Compute", "Graphics", "MPSCompute")
# NVML_VALUE_NOT_AVAILABLE for unsigned long long fields (memory the driver cannot see).
VALUE_NOT_AVAILABLE = 2**64 - 1
NVML_DEVICE_MIG_ENABLE = 1
# Per-process utilisation samples are asked for since the previous reading of the GPU, at most this far
# back; at a GPU's first reading, since the default probe interval ago.
PROCESS_UTILIZATION_FIRST_SECONDS = 10
PROCESS_UTILIZATION_MAX_SECONDS = 60

# Error codes from nvml.h (stable across drivers; the binding has the same numbers).
NVML_SUCCESS = 0  # the binding raises it when a size query finds nothing to size
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
# After these the open NVML session is useless: shut it down, initialise again at the next read.
DRIVER_LEVEL_ERRORS = frozenset({
    NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
})

# Initialisation errors, in words of our own.
_INIT_REASONS = {
    NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND:
        "NVML library not found (libnvidia-ml.so.1; is the NVIDIA driver installed?)",
    NVML_ERROR_NO_PERMISSION: "no permission to use NVML",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        "NVML library and kernel driver versions differ (reload the nvidia module or reboot)",
}

Listings = dict[str, Listing | None]  # process-list kind -> the C function and record to use

_session: ModuleType | None = None  # the pynvml module whose nvmlInit succeeded in this process
_session_pid = 0
_shutdown_registered = False
# XID events of this process's sessions: the set lives with the session, what it saw outlives it.
_xids = XidWatch()
# GPU uuid -> when this process last asked for its per-process utilisation (NVML's microseconds).
_utilization_read_at: dict[str, int] = {}


class NvmlUnavailable(Exception):
    pass


class _Missing(Exception):
    """The binding or the driver has no such function: try the next variant."""


class NvmlCalls:
    """The one place NVML errors are handled."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.errors: list[str] = []
        self.driver_level_error = False

    def attempt(self, what: str, *variants: Callable[[], Any], quiet: Collection[int] = (),
                optional: bool = False) -> Any | None:
        """The result of the first variant this binding and driver have; None when the call
        failed (said in the reason unless its error code is in `quiet`) or, unless optional,
        when none of them exists."""
        for variant in variants:
            try:
                return variant()
            except _Missing:
                continue
            # Whatever the binding throws, only this value is lost, never the snapshot.
            except Exception as exc:
                if self._function_missing(exc):
                    continue
                code = getattr(exc, "value", None)
                if code in DRIVER_LEVEL_ERRORS:
                    self.driver_level_error = True
                if code not in quiet:
                    self.errors.append(f"{what}: {self.describe(exc)}")
                return None
        if not optional:
            self.errors.append(f"{what}: not supported by this driver")
        return None

    def call(self, what: str, name: str, *args: Any, quiet: Collection[int] = (), optional: bool = False,
             **kwargs: Any) -> Any | None:
        return self.attempt(what, self.binding(name, *args, **kwargs), quiet=quiet, optional=optional)

    def binding(self, name: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """A call of the binding's `name`, raising _Missing when this binding lacks it."""

        def run() -> Any:
            function = getattr(self.nvml, name, None)
            if function is None:
                raise _Missing(name)
            return function(*args, **kwargs)

        return run

    def has_symbol(self, name: str) -> bool:
        """Does the loaded driver library export this C function?"""
        try:
            self.nvml._nvmlGetFunctionPointer(name)
        except Exception:
            return False
        return True

    def c_function(self, name: str) -> Callable[..., int]:
        return self.nvml._nvmlGetFunctionPointer(name)  # type: ignore[no-any-return]

    def describe(self, exc: BaseException) -> str:
        if isinstance(exc, self._nvml_error_type()):
            try:
                return str(exc)  # may itself ask the library (nvmlErrorString)
            except Exception:
                return f"NVML error {getattr(exc, 'value', '?')}"
        return f"{type(exc).__name__}: {exc}"

    def _nvml_error_type(self) -> type[BaseException]:
        error = getattr(self.nvml, "NVMLError", None)
        return error if isinstance(error, type) and issubclass(error, BaseException) else _Missing

    def _function_missing(self, exc: BaseException) -> bool:
        # Unversioned pynvml wrappers turn FunctionNotFound into NVMLLibraryMismatchError.
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", None)
        if isinstance(mismatch, type) and isinstance(exc, mismatch):
            return True
        return isinstance(exc, self._nvml_error_type()) and getattr(exc, "value", None) == \
            NVML_ERROR_FUNCTION_NOT_FOUND

    def reason(self) -> str | None:
        return join_reasons(*self.errors)


# --- lifetime ---------------------------------------------------------------


def _open() -> ModuleType:
    global _session, _session_pid, _shutdown_registered  # noqa: PLW0603 - NVML is per-process state
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
    if _session is pynvml and _session_pid == os.getpid():
        return cast(ModuleType, pynvml)
    if _session is not None and _session_pid == os.getpid():
        close()  # another pynvml module object than the one initialised (tests swap it)
    # A forked child (a worker pool process) must not use its parent's session: start its own.
    try:
        pynvml.nvmlInit()
    # Whatever a broken driver install throws, the process half of the snapshot must still go out.
    except Exception as exc:
        code = getattr(exc, "value", None)
        reason = _INIT_REASONS.get(code) if isinstance(code, int) else None
        raise NvmlUnavailable(reason or f"NVML initialisation failed: {exc}") from exc
    _session, _session_pid = pynvml, os.getpid()
    if not _shutdown_registered:
        atexit.register(close)
        _shutdown_registered = True
    return cast(ModuleType, pynvml)


def close() -> None:
    """nvmlShutdown of this process's session, if it has one: at exit, and after a driver-level
    error so that the next read initialises NVML again. Releases the /dev/nvidia* files NVML holds."""
    global _session
    module, _session = _session, None
    _xids.session_closed()
    _utilization_read_at.clear()  # a new session looks back as at a first reading
    if module is None or _session_pid != os.getpid():
        return
    with contextlib.suppress(Exception):  # a driver that is gone has nothing left to release
        module.nvmlShutdown()


# --- reading ----------------------------------------------------------------


def read() -> GpuState:
    try:
        nvml = _open()
    except NvmlUnavailable as exc:
        return unavailable(BACKEND, str(exc))
    calls = NvmlCalls(nvml)
    try:
        state = _read(calls)
    # A surprise of ours or of the binding outside NvmlCalls: GPU data is lost, the snapshot is not.
    except Exception as exc:
        calls.errors.append(f"NVML backend failed: {type(exc).__name__}: {exc}")
        state = GpuState(backend=BACKEND, available=False, reason=calls.reason())
    if calls.driver_level_error:
        close()
    return state


def _read(calls: NvmlCalls) -> GpuState:
    driver_version = _text(calls.call("driver version", "nvmlSystemGetDriverVersion"))
    count = calls.call("device count", "nvmlDeviceGetCount")
    if count is None:
        return GpuState(backend=BACKEND, available=False, reason=calls.reason(),
                        driver_version=driver_version)
    listings = {kind: choose_listing(kind, driver_version, calls.has_symbol) for kind in PROCESS_LISTS}
    _xids.drain(calls)  # before any GPU is read: its events up to now
    gpus: list[Gpu] = []
    memory_by_holder: dict[tuple[int, str, int | None, int | None], int | None] = {}
    utilization: list[ProcessUtilization] = []
    for index in range(count):
        gpu, holders, busy = _read_device(calls, index, listings)
        gpus.append(gpu)
        utilization.extend(ProcessUtilization(pid, gpu.uuid, percent) for pid, percent in busy.items())
        for holder in holders:
            key = (holder.pid, holder.gpu_uuid, holder.gpu_instance_id, holder.compute_instance_id)
            # A process can sit in several lists (compute and graphics): count it once.
            if key not in memory_by_holder or (holder.used_memory_bytes or 0) > (memory_by_holder[key] or 0):
                memory_by_holder[key] = holder.used_memory_bytes
    processes = tuple(GpuProcess(pid, uuid, used, gi, ci)
                      for (pid, uuid, gi, ci), used in memory_by_holder.items())
    return GpuState(backend=BACKEND, available=True, reason=calls.reason(), gpus=tuple(gpus),
                    processes=processes, driver_version=driver_version,
                    process_utilization=tuple(utilization))


def _read_device(calls: NvmlCalls, index: int, listings: Listings
                 ) -> tuple[Gpu, list[GpuProcess], dict[int, int]]:
    where = f"GPU {index}"
    placeholder_uuid = f"GPU-unknown-index-{index}"
    handle = calls.call(f"{where} handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return Gpu(index, placeholder_uuid, "", None, None, None), [], {}
    uuid = _text(calls.call(f"{where} uuid", "nvmlDeviceGetUUID", handle)) or placeholder_uuid
    name = _text(calls.call(f"{where} name", "nvmlDeviceGetName", handle)) or ""
    memory_variants = []
    if hasattr(calls.nvml, "nvmlMemory_v2"):
        # v2 reports driver-reserved memory apart from `used`; that memory belongs to no process.
        memory_variants.append(
            calls.binding("nvmlDeviceGetMemoryInfo", handle, version=calls.nvml.nvmlMemory_v2)
        )
    memory_variants.append(calls.binding("nvmlDeviceGetMemoryInfo", handle))
    memory = calls.attempt(f"{where} memory", *memory_variants)
    # Consumer GPUs and drivers before MIG say NotSupported: that is "MIG off", not a problem.
    mig_mode = calls.call(f"{where} MIG mode", "nvmlDeviceGetMigMode", handle,
                          quiet=(NVML_ERROR_NOT_SUPPORTED,), optional=True)
    mig_on = bool(mig_mode and mig_mode[0] == NVML_DEVICE_MIG_ENABLE)
    instances: tuple[MigInstance, ...] | None = None
    if mig_on:
        # The parent handle lists processes only with privileges (and then all instances mixed),
        # and has no utilization in MIG mode: ask each MIG device instead.
        instances, holders = _read_mig_devices(calls, where, handle, uuid, listings)
        utilization = None
        busy: dict[int, int] = {}  # NVML has no per-process utilisation in MIG mode either
    else:
        utilization = calls.call(f"{where} utilization", "nvmlDeviceGetUtilizationRates", handle)
        holders = _processes_on(calls, where, handle, uuid, listings)
        busy = _process_utilization(calls, where, handle, uuid[:128])
    watched = _xids.watch(calls, where, handle, uuid[:128])
    health = read_health(calls, where, handle, _xids.errors_of(uuid[:128]) if watched else None)
    gpu = Gpu(
        index=index,
        uuid=uuid[:128],
        name=name[:256],
        memory_total_bytes=_bytes(getattr(memory, "total", None)),
        memory_used_bytes=_bytes(getattr(memory, "used", None)),
        utilization_percent=_percent(getattr(utilization, "gpu", None)),
        mig_instances=instances,
        health=health,
    )
    return gpu, holders, busy


def _process_utilization(calls: NvmlCalls, where: str, handle: Any, uuid: str) -> dict[int, int]:
    """PID -> its latest SM utilisation sample on this GPU since the previous reading; empty when the
    GPU gives none (NotSupported: older GPUs, vGPU; NotFound: no process computed since)."""
    now = time.time_ns() // 1000  # NVML's sample timestamps: CPU time in microseconds
    previous = _utilization_read_at.get(uuid)
    since = (now - PROCESS_UTILIZATION_FIRST_SECONDS * 1_000_000 if previous is None
             else max(previous, now - PROCESS_UTILIZATION_MAX_SECONDS * 1_000_000))
    samples = calls.call(f"{where} process utilization", "nvmlDeviceGetProcessUtilization", handle, since,
                         quiet=(NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND), optional=True)
    _utilization_read_at[uuid] = now
    latest: dict[int, tuple[int, int]] = {}
    for sample in samples or ():
        pid, stamp, percent = int(sample.pid), int(sample.timeStamp), int(sample.smUtil)
        if pid <= 0 or percent > 100:
            continue  # not a figure: a misread or a driver's "not available"
        if pid not in latest or stamp >= latest[pid][0]:
            latest[pid] = (stamp, percent)
    return {pid: percent for pid, (_, percent) in latest.items()}


def _read_mig_devices(calls: NvmlCalls, where: str, handle: Any, parent_uuid: str,
                      listings: Listings) -> tuple[tuple[MigInstance, ...], list[GpuProcess]]:
    slots = calls.call(f"{where} MIG device count", "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    instances: list[MigInstance] = []
    holders: list[GpuProcess] = []
    for slot in range(int(slots)):
        label = f"{where} MIG device {slot}"
        # An empty slot is NotFound: most of a GPU's slots are empty.
        mig = calls.call(f"{label} handle", "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot,
                         quiet=(NVML_ERROR_NOT_FOUND,))
        if mig is None:
            continue
        gpu_instance_id = _small_int(
            calls.call(f"{label} GPU instance id", "nvmlDeviceGetGpuInstanceId", mig)
        )
        compute_instance_id = _small_int(
            calls.call(f"{label} compute instance id", "nvmlDeviceGetComputeInstanceId", mig)
        )
        memory = calls.call(f"{label} memory", "nvmlDeviceGetMemoryInfo", mig)
        if gpu_instance_id is not None and compute_instance_id is not None:
            mig_uuid = (_text(calls.call(f"{label} uuid", "nvmlDeviceGetUUID", mig))
                        or f"{parent_uuid}/mig-{slot}")
            instances.append(MigInstance(
                uuid=mig_uuid[:128],
                name=(_text(calls.call(f"{label} name", "nvmlDeviceGetName", mig)) or "")[:256],
                gpu_instance_id=gpu_instance_id,
                compute_instance_id=compute_instance_id,
                memory_total_bytes=_bytes(getattr(memory, "total", None)),
                memory_used_bytes=_bytes(getattr(memory, "used", None)),
            ))
        holders.extend(_processes_on(calls, label, mig, parent_uuid, listings,
                                     instance=(gpu_instance_id, compute_instance_id)))
    return tuple(instances), holders


def _list_with(calls: NvmlCalls, listing: Listing, handle: Any) -> list[ProcessRecord]:
    return list_processes(calls.c_function(listing.function), listing.record, handle, calls.nvml.NVMLError)


def _processes_on(calls: NvmlCalls, where: str, handle: Any, gpu_uuid: str, listings: Listings, *,
                  instance: tuple[int | None, int | None] = (None, None)) -> list[GpuProcess]:
    holders: list[GpuProcess] = []
    for kind in PROCESS_LISTS:
        listing = listings[kind]
        mps = kind == "MPSCompute"
        what = f"{where} {kind.lower()} processes"
        if listing is None:
            if not mps:  # MPS lists are newer than the others; without them there is no MPS to list
                calls.errors.append(f"{what}: not supported by this driver")
            continue
        records = calls.attempt(
            what,
            partial(_list_with, calls, listing, handle),
            # No MPS server on this GPU is the usual case, not news for every snapshot.
            quiet=(NVML_ERROR_NOT_SUPPORTED,) if mps else (),
        )
        for record in records or ():
            holders.append(GpuProcess(
                pid=record.pid,
                gpu_uuid=gpu_uuid,
                used_memory_bytes=record.used_memory_bytes,
                gpu_instance_id=instance[0] if instance[0] is not None else record.gpu_instance_id,
                compute_instance_id=instance[1] if instance[1] is not None else record.compute_instance_id,
            ))
    return holders


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


def _small_int(value: Any) -> int | None:
    number = _bytes(value)
    return number if number is not None and number < 0xFFFFFFFF else None


# --- before and for a GPU reset (an approved reset order: gpuadmin/probe/kill/reset.py) ---------

# nvmlGpuVirtualizationMode_t, in the words ResetFacts uses.
VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}


def reset_facts(uuid: str) -> ResetFacts | None:
    """What NVML says of the GPU ``uuid`` before a reset; None when NVML knows no such GPU.

    Raises NvmlUnavailable when NVML cannot be used at all.
    """
    nvml = _open()
    calls = NvmlCalls(nvml)
    handle = calls.call("handle", "nvmlDeviceGetHandleByUUID", uuid, quiet=(NVML_ERROR_NOT_FOUND,))
    if handle is None:
        return None
    index = _small_int(calls.call("index", "nvmlDeviceGetIndex", handle))
    minor = _small_int(calls.call("minor number", "nvmlDeviceGetMinorNumber", handle))
    mig_mode = calls.call("MIG mode", "nvmlDeviceGetMigMode", handle, quiet=(NVML_ERROR_NOT_SUPPORTED,),
                          optional=True)
    instances = None
    if mig_mode and mig_mode[0] == NVML_DEVICE_MIG_ENABLE:
        slots = calls.call("MIG device count", "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        instances = sum(
            calls.call("MIG device", "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot,
                       quiet=(NVML_ERROR_NOT_FOUND,)) is not None
            for slot in range(int(slots))
        )
    persistence = calls.call("persistence mode", "nvmlDeviceGetPersistenceMode", handle,
                             quiet=(NVML_ERROR_NOT_SUPPORTED,), optional=True)
    virtualization = calls.call("virtualization mode", "nvmlDeviceGetVirtualizationMode", handle,
                                quiet=(NVML_ERROR_NOT_SUPPORTED,), optional=True)
    return ResetFacts(
        uuid=uuid,
        index=index if index is not None else -1,
        device_path=f"/dev/nvidia{minor}" if minor is not None else None,
        mig_instances=instances,
        persistence_mode=None if persistence is None else bool(persistence),
        virtualization=None if virtualization is None else VIRTUALIZATION_MODES.get(
            virtualization, f"mode {virtualization}"),
    )


def reset(uuid: str, *, timeout_seconds: float) -> None:
    """``nvidia-smi --gpu-reset -i <uuid>`` (nvidia-ml-py has no reset call); GpuResetFailed with
    what nvidia-smi said when it did not reset.

    This process's own NVML session holds the GPU's device file open, which the driver counts
    as a user of the GPU: it is shut down first (the next snapshot opens a new one).
    """
    close()
    command = ["nvidia-smi", "--gpu-reset", "-i", uuid]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds, check=False)
    except FileNotFoundError:
        raise GpuResetFailed("nvidia-smi is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise GpuResetFailed(f"nvidia-smi --gpu-reset did not finish within {timeout_seconds:g} s") from None
    if done.returncode != 0:
        said = " ".join((done.stdout + " " + done.stderr).split())[:900] or "no output"
        raise GpuResetFailed(f"nvidia-smi --gpu-reset exited with status {done.returncode}: {said}")
