"""A GPU's health through NVML: temperature, power, clock event reasons, ECC counts, row remapping
or page retirement, and the XID errors the agent sees as NVML events while it runs.

Every call goes through nvml.NvmlCalls. A GPU that cannot say (a consumer card has no ECC, an
Ampere GPU retires no pages, a container may not read power) answers NotSupported or
NoPermission: that field is None, never 0, and the backend's reason stays quiet about it, as it
would otherwise repeat the same line in every snapshot of most hosts.

XID events: NVML queues the events of the devices registered on an event set, from registration
on. ``XidWatch`` keeps one set for the open NVML session, registers each GPU once, and drains
the queue without waiting (timeout 0) at each read; what it saw is remembered per GPU uuid for
``XID_REMEMBERED_SECONDS`` across sessions (an XID 79 ends the session: the GPU is lost), so
the snapshots of the following day still name it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuadmin.probe.gpus import MAX_TEMPERATURE_CELSIUS, GpuHealth, XidError, clock_event_reason_names
from gpuadmin.wire.timestamps import wire_time

if TYPE_CHECKING:
    from gpuadmin.probe.gpus.nvml import NvmlCalls

# nvml.h values (the binding has the same numbers).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_TIMEOUT = 10
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# A GPU that cannot say: an unknown value, not news.
_CANNOT_SAY = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION)
XID_REMEMBERED_SECONDS = 24 * 3600
# Events drained per read at most: a GPU in an XID storm must not hold the snapshot up.
XID_EVENTS_PER_READ_MAX = 10_000


def read_health(calls: NvmlCalls, where: str, handle: Any, xid_errors: tuple[XidError, ...] | None
                ) -> GpuHealth:
    def ask(what: str, name: str, *args: Any) -> Any:
        return calls.call(f"{where} {what}", name, handle, *args, quiet=_CANNOT_SAY, optional=True)

    reasons = calls.attempt(
        f"{where} clock event reasons",
        calls.binding("nvmlDeviceGetCurrentClocksEventReasons", handle),
        calls.binding("nvmlDeviceGetCurrentClocksThrottleReasons", handle),  # its name before 12.535
        quiet=_CANNOT_SAY, optional=True,
    )
    remapped = ask("remapped rows", "nvmlDeviceGetRemappedRows")
    remapped = remapped if isinstance(remapped, tuple) and len(remapped) == 4 else None
    ecc = {
        (error, counter): _count(ask("ECC errors", "nvmlDeviceGetTotalEccErrors", error, counter))
        for error in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        for counter in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC)
    }
    single = ask("retired pages", "nvmlDeviceGetRetiredPages",
                 NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = ask("retired pages", "nvmlDeviceGetRetiredPages",
                 NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending_pages = ask("retired pages pending", "nvmlDeviceGetRetiredPagesPendingStatus")
    return GpuHealth(
        temperature_celsius=_count(ask("temperature", "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU),
                                   most=MAX_TEMPERATURE_CELSIUS),
        power_draw_milliwatts=_count(ask("power draw", "nvmlDeviceGetPowerUsage")),
        power_limit_milliwatts=_count(ask("power limit", "nvmlDeviceGetEnforcedPowerLimit")),
        clock_event_reasons=clock_event_reason_names(reasons) if isinstance(reasons, int) else None,
        ecc_volatile_corrected_errors=ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC],
        ecc_volatile_uncorrected_errors=ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC],
        ecc_aggregate_corrected_errors=ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC],
        ecc_aggregate_uncorrected_errors=ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC],
        remapped_rows_correctable=_count(remapped[0]) if remapped else None,
        remapped_rows_uncorrectable=_count(remapped[1]) if remapped else None,
        remapped_rows_pending=bool(remapped[2]) if remapped else None,
        remapped_rows_failed=bool(remapped[3]) if remapped else None,
        retired_pages_single_bit_ecc=len(single) if isinstance(single, list) else None,
        retired_pages_double_bit_ecc=len(double) if isinstance(double, list) else None,
        retired_pages_pending=bool(pending_pages) if isinstance(pending_pages, int) else None,
        xid_errors=xid_errors,
    )


def _count(value: object, *, most: int = 2**63 - 1) -> int | None:
    """A non-negative integer NVML gave, or None (the binding may hand back anything)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > most:
        return None
    return value


@dataclass
class _Seen:
    count: int
    last_seen: float


@dataclass
class XidWatch:
    """The XID events of one process's NVML sessions (module state of nvml.py)."""

    clock: Callable[[], float] = time.time
    event_set: Any = None
    registered: dict[str, bool] = field(default_factory=dict)  # GPU uuid -> events registered
    seen: dict[str, dict[int, _Seen]] = field(default_factory=dict)  # GPU uuid -> XID -> seen

    def session_closed(self) -> None:
        """The session's set went with it (nvmlShutdown frees it); what was seen is kept."""
        self.event_set = None
        self.registered.clear()

    def watch(self, calls: NvmlCalls, where: str, handle: Any, uuid: str) -> bool:
        """Register this GPU's XID events on the session's set, once; False when it cannot be."""
        if uuid in self.registered:
            return self.registered[uuid]
        if self.event_set is None:
            self.event_set = calls.call("XID event set", "nvmlEventSetCreate", quiet=_CANNOT_SAY,
                                        optional=True)
            if self.event_set is None:
                return False
        register = calls.binding("nvmlDeviceRegisterEvents", handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                                 self.event_set)
        # It returns None on success, as attempt() does on failure.
        ok = calls.attempt(f"{where} XID events", lambda: (register(), True)[1], quiet=_CANNOT_SAY,
                           optional=True)
        self.registered[uuid] = ok is True
        return self.registered[uuid]

    def drain(self, calls: NvmlCalls) -> None:
        """Take every event queued since the last read, waiting for none."""
        if self.event_set is None:
            return
        for _ in range(XID_EVENTS_PER_READ_MAX):
            # Timeout is the empty queue, not news.
            event = calls.call("XID events", "nvmlEventSetWait_v2", self.event_set, 0,
                               quiet=(NVML_ERROR_TIMEOUT, *_CANNOT_SAY), optional=True)
            if event is None:
                return
            if not getattr(event, "eventType", 0) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                continue
            uuid = calls.call("XID event's GPU", "nvmlDeviceGetUUID", event.device)
            xid = _count(getattr(event, "eventData", None))
            if uuid is None or xid is None or xid > 0xFFFFFFFF:
                continue
            key = uuid.decode("utf-8", "replace") if isinstance(uuid, bytes) else str(uuid)
            seen = self.seen.setdefault(key[:128], {}).setdefault(xid, _Seen(0, 0.0))
            seen.count += 1
            seen.last_seen = self.clock()

    def errors_of(self, uuid: str) -> tuple[XidError, ...] | None:
        """What was seen on this GPU within the remembered window; None when it is not watched."""
        if not self.registered.get(uuid):
            return None
        now = self.clock()
        kept = {xid: s for xid, s in self.seen.get(uuid, {}).items()
                if now - s.last_seen <= XID_REMEMBERED_SECONDS}
        self.seen[uuid] = kept
        return tuple(XidError(xid, s.count, wire_time(s.last_seen, timespec="seconds"))
                     for xid, s in sorted(kept.items()))

