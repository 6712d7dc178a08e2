"""NVML's process lists, read with record types of our own, sized by what the driver fills.

Why not the binding's `nvmlDeviceGet*RunningProcesses*` wrappers: their record
type is a guess fixed at release time, and a wrong guess shifts every field.
`..._v3` fills 32-byte records on drivers 535.43 to 535.86 (a field for
confidential-computing memory that later drivers dropped again) and 24-byte
records on every other driver; nvidia-ml-py 12.535.77 reads 32 bytes, every
later binding 24. Three processes 1000/1001/1002 read with 24 bytes from a
32-byte driver come back as (1000, 1 GiB), (0, 1001), (4294967295, 0). The
bindings also have no v1 wrapper at all (the plain name calls `_v3`), and `_v2`
wrappers only from 12.550. So the driver's C functions are called here,
through the binding's loaded library (`_nvmlGetFunctionPointer`, present in
every binding read), with the record that function fills on this driver:

    C function                 drivers                      record
    ..._v3                     535.43 - 535.86              32 bytes (v3 with cc-protected memory)
    ..._v3                     every other driver with it   24 bytes (v2 layout)
    ..._v2                     R450 and later, without _v3  24 bytes
    plain name (v1)            older drivers                16 bytes

The driver version decides the 32-byte case; when it cannot be parsed, the
symbols do (nvitop's test: the confidential-computing memory call exists and
the process detail list, which replaced the 32-byte records, does not).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
# NVML_VALUE_NOT_AVAILABLE as an unsigned long long: memory the driver cannot tell (WDDM, some MIG setups).
VALUE_NOT_AVAILABLE = 2**64 - 1
# gpuInstanceId / computeInstanceId of a process that is not on a MIG instance.
NO_INSTANCE = 0xFFFFFFFF
# The first record of the 32-byte layout's drivers and the last; both inclusive, (major, minor).
RECORDS_32_BYTES_FROM = (535, 43)
RECORDS_32_BYTES_UNTIL = (535, 86)
# A process can start between the sizing call and the filling call; ask again this often.
_FILL_ATTEMPTS = 3
_VERSION = re.compile(r"^(\d+)\.(\d+)")


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ProcessInfoV3Cc(ctypes.Structure):
    _fields_ = [*ProcessInfoV2._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    pid: int
    used_memory_bytes: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True, slots=True)
class Listing:
    """Which C function to call for one kind of list, and the record it fills."""

    function: str
    record: type[ctypes.Structure]


def parse_driver_version(text: str | None) -> tuple[int, int] | None:
    found = _VERSION.match(text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def choose_listing(kind: str, driver_version: str | None,
                   has_symbol: Callable[[str], bool]) -> Listing | None:
    """The newest `nvmlDeviceGet<kind>RunningProcesses` variant the driver exports, with its record."""
    base = f"nvmlDeviceGet{kind}RunningProcesses"
    if has_symbol(f"{base}_v3"):
        return Listing(f"{base}_v3", ProcessInfoV3Cc if fills_32_byte_records(driver_version, has_symbol)
                       else ProcessInfoV2)
    if has_symbol(f"{base}_v2"):
        return Listing(f"{base}_v2", ProcessInfoV2)
    if has_symbol(base):
        return Listing(base, ProcessInfoV1)
    return None


def fills_32_byte_records(driver_version: str | None, has_symbol: Callable[[str], bool]) -> bool:
    version = parse_driver_version(driver_version)
    if version is not None:
        return RECORDS_32_BYTES_FROM <= version <= RECORDS_32_BYTES_UNTIL
    return has_symbol("nvmlDeviceGetConfComputeMemSizeInfo") and not has_symbol(
        "nvmlDeviceGetRunningProcessDetailList"
    )


def list_processes(function: Callable[..., int], record: type[ctypes.Structure], handle: Any,
                   error: Callable[[int], Exception]) -> list[ProcessRecord]:
    """Call one process-list C function the way nvml.h asks: size, then fill a larger array.

    `error(code)` builds the exception for a failed call (the binding's NVMLError).
    """
    count = ctypes.c_uint(0)
    code = function(handle, ctypes.byref(count), None)
    if code == NVML_SUCCESS:  # nothing to list
        return []
    for _ in range(_FILL_ATTEMPTS):
        if code != NVML_ERROR_INSUFFICIENT_SIZE:
            raise error(code)
        # Room for processes that start between the two calls, as the binding allows.
        capacity = count.value * 2 + 5
        records = (record * capacity)()
        count = ctypes.c_uint(capacity)
        code = function(handle, ctypes.byref(count), records)
        if code == NVML_SUCCESS:
            return [_record(records[i]) for i in range(min(count.value, capacity))]
    raise error(code)


def _record(raw: Any) -> ProcessRecord:
    used = int(raw.usedGpuMemory)
    return ProcessRecord(
        pid=int(raw.pid),
        used_memory_bytes=None if used == VALUE_NOT_AVAILABLE else used,
        gpu_instance_id=_instance_id(getattr(raw, "gpuInstanceId", NO_INSTANCE)),
        compute_instance_id=_instance_id(getattr(raw, "computeInstanceId", NO_INSTANCE)),
    )


def _instance_id(value: int) -> int | None:
    return None if value == NO_INSTANCE else int(value)
