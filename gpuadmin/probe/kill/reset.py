"""A GPU reset, the last approved step when memory does not come back: checked right before.

An approved reset order (docs/kill-order.md, *Resetting a GPU*) names one GPU by
UUID. Right before resetting it the agent looks again, itself, whatever central
saw: the GPU exists; it is not a virtual machine's (passthrough) or a vGPU
host's device; it is not in MIG mode with instances configured (a reset of the
whole GPU would take every instance's work with it); NVML lists no process on
it; and no process holds its device file (/dev/nvidia<minor>) open, the way
the probe's device scan finds holders (the agent's own processes excepted:
their NVML session is theirs, and is shut down before the reset). Only then
does it reset: ``nvidia-smi --gpu-reset -i <uuid>``, or the simulated backend's
reset. Any "no" is a refusal that names why ("held by pid 1234 (python
train.py)", "the driver refused: ..."); nothing was changed then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuadmin.probe import procfs
from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.devices import DeviceMatcher
from gpuadmin.probe.gpus import GpuResetFailed, ResetFacts, read_gpus
from gpuadmin.wire.kill_protocol import RESET_TIMEOUT_SECONDS, ResetRefusal, Result

# The persistence daemon keeps every GPU's device file open while persistence mode is on;
# the driver resets around it, so it is noted, not counted as a holder.
PERSISTENCE_DAEMON = "nvidia-persistenced"
# How many holders a refusal names; the count says how many there were.
HOLDERS_NAMED = 5
COMMAND_LINE_CHARS = 120


@dataclass(slots=True)
class ResetOutcome:
    result: Result
    detail: str
    # Extra keys of the "finished" event: reason, gpu_uuid, gpu_index, persistence_mode, holders.
    fields: dict[str, Any] = field(default_factory=dict)


def describe_holder(pid: int) -> str:
    """'pid 1234 (python train.py)': its command line as /proc shows it, clipped."""
    raw = procfs.read_cmdline_bytes(pid)
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part) if raw else ""
    if not text:
        stat = procfs.read_stat(pid)
        text = f"[{stat.comm}]" if stat else "gone"
    if len(text) > COMMAND_LINE_CHARS:
        text = text[: COMMAND_LINE_CHARS - 1] + "…"
    return f"pid {pid} ({text})"


def _facts(config: ProbeConfig, uuid: str) -> ResetFacts | str | None:
    """The GPU's facts, None when the backend has no such GPU, or why they cannot be read."""
    if config.gpu_backend == "simulated":
        from gpuadmin.probe.gpus import simulated

        if not config.simulated_gpus_path:
            return "no simulated GPU file configured"
        try:
            return simulated.reset_facts(config.simulated_gpus_path, uuid)
        except (OSError, ValueError) as error:
            return f"simulated GPU file {config.simulated_gpus_path}: {error}"
    if config.gpu_backend == "none":
        return "the GPU backend is disabled on this host (gpu backend 'none')"
    from gpuadmin.probe.gpus import nvml

    try:
        return nvml.reset_facts(uuid)
    except nvml.NvmlUnavailable as error:
        return str(error)


def _reset(config: ProbeConfig, uuid: str) -> None:
    if config.gpu_backend == "simulated":
        from gpuadmin.probe.gpus import simulated

        assert config.simulated_gpus_path
        simulated.reset(config.simulated_gpus_path, uuid)
        return
    from gpuadmin.probe.gpus import nvml

    nvml.reset(uuid, timeout_seconds=RESET_TIMEOUT_SECONDS)


def holders(config: ProbeConfig, facts: ResetFacts) -> tuple[list[int], int]:
    """PIDs on the GPU (NVML's lists) or holding its device file, the agent's own excepted; and how many
    processes' open files could not be read."""
    from gpuadmin.probe.snapshot import agent_processes, scan_host

    state = read_gpus(config)
    on_gpu = {p.pid for p in state.processes if p.gpu_uuid == facts.uuid}
    denied = 0
    stats: dict[int, procfs.StatFields] = {}
    by_device: set[int] = set()
    if facts.device_path:
        stats, scan = scan_host(DeviceMatcher(facts.device_path))
        by_device = set(scan.holders)
        denied = scan.denied_pids
    else:
        stats = {pid: stat for pid in on_gpu if (stat := procfs.read_stat(pid)) is not None}
    own = agent_processes(stats) if stats else set()
    found = sorted(
        pid for pid in (on_gpu | by_device) - own
        if not (pid in stats and stats[pid].comm == PERSISTENCE_DAEMON)
    )
    return found, denied


def _gpu_words(facts: ResetFacts) -> str:
    return f"GPU {facts.index} ({facts.uuid})" if facts.index >= 0 else f"GPU {facts.uuid}"


def _persistence_words(facts: ResetFacts) -> str:
    if facts.persistence_mode is None:
        return "persistence mode unknown"
    return f"persistence mode {'on' if facts.persistence_mode else 'off'}"


def reset_gpu(uuid: str, config: ProbeConfig) -> ResetOutcome:  # noqa: PLR0911 - one return per refusal
    """Check the GPU as the module says, and reset it only when every check passed."""
    fields: dict[str, Any] = {"gpu_uuid": uuid}

    def refused(reason: ResetRefusal, detail: str) -> ResetOutcome:
        return ResetOutcome(Result.REFUSED, f"not reset: {detail}", {**fields, "reason": reason.value})

    facts = _facts(config, uuid)
    if isinstance(facts, str):
        return refused(ResetRefusal.BACKEND_UNAVAILABLE, f"the GPU cannot be checked: {facts}")
    if facts is None:
        return refused(ResetRefusal.GPU_NOT_FOUND, f"this host has no GPU {uuid}")
    gpu = _gpu_words(facts)
    fields.update(gpu_index=facts.index, persistence_mode=facts.persistence_mode,
                  virtualization=facts.virtualization)
    if facts.virtualization not in (None, "none"):
        kind = "a virtual machine's passthrough GPU" if facts.virtualization == "passthrough" else (
            f"a virtualized GPU ({facts.virtualization})")
        return refused(ResetRefusal.VIRTUAL_MACHINE,
                       f"{gpu} is {kind}: not allowed; its hypervisor resets it")
    if facts.mig_instances:
        return refused(
            ResetRefusal.MIG_IN_USE,
            f"{gpu} is in MIG mode with {facts.mig_instances} instance(s); a reset of the whole GPU would "
            "end every instance's work: destroy the instances first (nvidia-smi mig -dci, -dgi)",
        )
    found, denied = holders(config, facts)
    fields["holders"] = [{"pid": pid} for pid in found[:HOLDERS_NAMED]]
    if found:
        named = ", ".join(describe_holder(pid) for pid in found[:HOLDERS_NAMED])
        more = f" and {len(found) - HOLDERS_NAMED} more" if len(found) > HOLDERS_NAMED else ""
        return refused(ResetRefusal.GPU_HELD, f"{gpu} is held by {named}{more}; end them first")
    try:
        _reset(config, uuid)
    except GpuResetFailed as error:
        return refused(ResetRefusal.DRIVER_REFUSED, f"the driver refused: {error}")
    notes = [_persistence_words(facts)]
    if denied:
        notes.append(f"the open files of {denied} process(es) could not be read; the driver checked them")
    return ResetOutcome(Result.SUCCEEDED, f"{gpu} reset; {'; '.join(notes)}", fields)
