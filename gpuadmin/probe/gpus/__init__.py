"""GPU backends: what each GPU holds and which PIDs hold it.

Every backend returns a GpuState; none of them raises for a GPU problem: an
unusable backend is a state with available=False and the reason, which the
panel shows as a finding.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuadmin.probe.config import ProbeConfig


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None

    def as_document(self) -> dict[str, object]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_used_bytes": self.memory_used_bytes,
            "utilization_percent": self.utilization_percent,
        }


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One PID's memory on one GPU, as the backend reports it (None: not available)."""

    pid: int
    gpu_uuid: str
    used_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuState:
    backend: str  # nvml | simulated | none
    available: bool
    reason: str | None = None
    gpus: tuple[Gpu, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    driver_version: str | None = None

    def backend_document(self) -> dict[str, object]:
        return {"name": self.backend, "available": self.available, "reason": self.reason}


def unavailable(backend: str, reason: str) -> GpuState:
    return GpuState(backend=backend, available=False, reason=reason)


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
