"""GPU backends: what each GPU holds and which PIDs hold it.

Every backend returns a GpuState; none of them raises for a GPU problem: an
unusable backend is a state with available=False and the reason, which the
panel shows as a finding.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from gpuadmin.probe.config import ProbeConfig

REASON_MAX_CHARS = 1024  # the schema's gpu_backend.reason maxLength
# Linux's PID_MAX_LIMIT on 64-bit kernels: no PID is larger, whatever pid_max says.
PID_MAX_LIMIT = 4_194_304
MAX_TEMPERATURE_CELSIUS = 1000  # the schema's bound: a sensor reading beyond it is no reading


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device of a GPU: a compute instance inside a GPU instance (ids as NVML gives them)."""

    uuid: str  # MIG-...
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_total_bytes: int | None
    memory_used_bytes: int | None

    def as_document(self) -> dict[str, object]:
        return {
            "uuid": self.uuid,
            "name": self.name,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
        }


# NVML's clocks event ("throttle") reason bits, by the names the snapshot uses (nvml.h
# nvmlClocksEventReason*). A bit not named here is written as "bit_<n>".
CLOCK_EVENT_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def clock_event_reason_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in NVML's reasons mask, lowest bit first."""
    names = {bit: name for name, bit in CLOCK_EVENT_REASON_BITS.items()}
    return tuple(names.get(1 << n, f"bit_{n}") for n in range(64) if mask >> n & 1)


@dataclass(frozen=True, slots=True)
class XidError:
    """One XID (a critical error the driver logged for a GPU) the agent saw as an NVML event."""

    xid: int
    count: int  # events of this XID on this GPU the agent saw within the remembered window
    last_seen_at: str  # UTC, "Z"

    def as_document(self) -> dict[str, object]:
        return {"xid": self.xid, "count": self.count, "last_seen_at": self.last_seen_at}


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """What the GPU says of its own health; every field None when the GPU or the driver cannot say
    (never 0 for "unknown"). docs/snapshot.md explains each field."""

    temperature_celsius: int | None = None
    power_draw_milliwatts: int | None = None
    power_limit_milliwatts: int | None = None
    clock_event_reasons: tuple[str, ...] | None = None
    ecc_volatile_corrected_errors: int | None = None
    ecc_volatile_uncorrected_errors: int | None = None
    ecc_aggregate_corrected_errors: int | None = None
    ecc_aggregate_uncorrected_errors: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    retired_pages_single_bit_ecc: int | None = None
    retired_pages_double_bit_ecc: int | None = None
    retired_pages_pending: bool | None = None
    xid_errors: tuple[XidError, ...] | None = None  # None: the agent cannot watch this GPU's XID events

    def as_document(self) -> dict[str, object]:
        document: dict[str, object] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "xid_errors" and value is not None:
                value = [x.as_document() for x in value]
            elif isinstance(value, tuple):
                value = list(value)
            document[name] = value
        return document


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None
    # None: MIG is off (or unknown); a tuple, possibly empty: MIG is on and these are its devices.
    mig_instances: tuple[MigInstance, ...] | None = None
    health: GpuHealth | None = None  # None: the backend says nothing of health

    def as_document(self) -> dict[str, object]:
        document: dict[str, object] = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "utilization_percent": self.utilization_percent,
        }
        if self.mig_instances is not None:
            document["mig_instances"] = [m.as_document() for m in self.mig_instances]
        if self.health is not None:
            document["health"] = self.health.as_document()
        return document


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One PID's memory on one GPU, as the backend reports it (None: not available).

    On a MIG instance, gpu_uuid is still the parent GPU's; the instance is named by its ids.
    """

    pid: int
    gpu_uuid: str
    used_memory_bytes: int | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """One PID's own SM utilisation on one GPU (0-100): NVML's latest per-process sample."""

    pid: int
    gpu_uuid: str
    percent: int


@dataclass(frozen=True, slots=True)
class GpuState:
    backend: str  # nvml | simulated | none
    available: bool
    reason: str | None = None
    gpus: tuple[Gpu, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    driver_version: str | None = None
    # Only where the GPU gave a figure (docs/snapshot.md, processes[].gpu_utilization_percent).
    process_utilization: tuple[ProcessUtilization, ...] = ()

    def backend_document(self) -> dict[str, object]:
        return {"name": self.backend, "available": self.available, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ResetFacts:
    """What the agent checks of one GPU right before resetting it (gpuadmin/probe/kill/reset.py)."""

    uuid: str
    index: int
    # The GPU's own device file (/dev/nvidia<minor>; the simulated GPU's "device"); None: unknown.
    device_path: str | None
    # None: MIG off (or unknown); else the number of MIG instances configured.
    mig_instances: int | None
    persistence_mode: bool | None
    # "none" on bare metal; "passthrough", "vgpu", "host_vgpu"...: a VM's device or a vGPU host's.
    virtualization: str | None


class GpuResetFailed(Exception):
    """The driver (nvidia-smi, or the simulated GPU) did not reset the GPU; the message says what it said."""


def unavailable(backend: str, reason: str) -> GpuState:
    return GpuState(backend=backend, available=False, reason=clip_reason(reason))


def clip_reason(text: str) -> str:
    return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 1] + "…"


def join_reasons(*parts: str | None) -> str | None:
    """Distinct non-empty parts, in order, joined with '; ' and clipped to the schema's limit."""
    kept = list(dict.fromkeys(p for p in parts if p))
    return clip_reason("; ".join(kept)) if kept else None


def read_gpus(config: ProbeConfig) -> GpuState:
    """The configured backend's reading; `auto` is nvml when NVML initialises, else none."""
    if config.gpu_backend == "none":
        return unavailable("none", "GPU backend disabled (gpu backend 'none')")
    if config.gpu_backend == "simulated":
        from gpuadmin.probe.gpus import simulated

        return simulated.read(config.simulated_gpus_path)
    from gpuadmin.probe.gpus import nvml

    state = nvml.read()
    if config.gpu_backend == "auto" and not state.available:
        return unavailable("none", state.reason or "NVML unavailable")
    return state


def drop_impossible_pids(state: GpuState, *, pid_max: int, live_pids: Collection[int]) -> GpuState:
    """The state without PIDs no process can have, each GPU's dropped PIDs named in the reason.

    0 and 0xFFFFFFFF are what a process record read with the wrong size looks like
    (docs/snapshot.md); a PID at or above pid_max cannot be allocated — unless pid_max
    was lowered after the process started, in which case /proc still knows it.
    """
    kept: list[GpuProcess] = []
    dropped: dict[str, list[int]] = {}
    for process in state.processes:
        impossible = process.pid <= 0 or process.pid > PID_MAX_LIMIT or (
            process.pid >= pid_max and process.pid not in live_pids
        )
        if impossible:
            dropped.setdefault(process.gpu_uuid, []).append(process.pid)
        else:
            kept.append(process)
    if not dropped:
        return state
    index_of = {gpu.uuid: gpu.index for gpu in state.gpus}
    lines = [
        f"GPU {index_of.get(uuid, uuid)}: dropped impossible PIDs {', '.join(map(str, sorted(set(pids))))}"
        f" (pid_max {pid_max}; misread process records?)"
        for uuid, pids in dropped.items()
    ]
    return replace(state, processes=tuple(kept), reason=join_reasons(state.reason, *lines))
