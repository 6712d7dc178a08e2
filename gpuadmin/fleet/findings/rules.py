"""Findings' rules: what a snapshot says is wrong on a host, each with a one-line remedy.

``compute_findings`` reads a validated document and returns drafts (pure, no
database: ``sync.py`` turns the drafts into open / refreshed / resolved
``Finding`` rows). Each remedy names the way out that works: a zombie is dealt
with through its parent, an orphan through a kill request, a D-state process
through the kernel, and memory nobody accounts for outside the process world.

Three kinds need more than one snapshot: a suspected leak (a process's GPU
memory rising snapshot after snapshot), an idle holder (GPU memory held at 0%
utilization for long) and PIDs running out (zombies growing, with a forecast of
when ``pid_max`` is reached). Ingest hands them ``HistoryFacts``, what history
says next to the snapshot; the function stays pure.

Titles quote command lines and user names, which any user on a GPU host
controls: they are clipped and stripped of control and bidirectional-override
characters here, and escaped by the templates like everything else.
"""

from __future__ import annotations

import unicodedata
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any, cast

from django.conf import settings

from gpuadmin.fleet.models import Finding
from gpuadmin.fleet.process_tree import (
    ProcessRow,
    Workload,
    ZombieTree,
    attributed_memory_bytes,
    orphans,
    process_rows,
    zombie_trees,
)
from gpuadmin.probe.owners import SLURM_JOB
from gpuadmin.text import clip, human_bytes, human_duration, utc_text

Kind = Finding.Kind
Severity = Finding.Severity

# Findings of these kinds are drawn from snapshots and resolved by them; the
# others (UNKILLABLE) belong to the kills app and are never touched here.
SNAPSHOT_KINDS = frozenset(
    {
        Kind.ZOMBIES,
        Kind.ORPHAN_GPU,
        Kind.UNINTERRUPTIBLE_GPU,
        Kind.UNATTRIBUTED_MEMORY,
        Kind.PID_EXHAUSTION,
        Kind.GPU_DATA_UNAVAILABLE,
        Kind.SUSPECTED_LEAK,
        Kind.IDLE_HOLDER,
        Kind.PIDS_RUNNING_OUT,
        Kind.GPU_HEALTH,
        Kind.OVER_ATTRIBUTED_MEMORY,
    }
)

ZOMBIES_WARNING_COUNT = 10
ZOMBIES_CRITICAL_COUNT = 1000
PID_USAGE_CRITICAL_RATIO = Fraction(95, 100)
_PIDS_LISTED_MAX = 10
_CONTAINERS_LISTED_MAX = 3
_DETAIL_PIDS_MAX = 100
_COMMAND_SHOWN_MAX_CHARS = 60
# CharFields, so always set (the field type says int | None for all fields).
_TITLE_MAX_CHARS = cast(int, Finding._meta.get_field("title").max_length)
_REMEDY_MAX_CHARS = cast(int, Finding._meta.get_field("remedy").max_length)
_KEY_MAX_CHARS = Finding._meta.get_field("key").max_length
# The PID trend needs this much history before it forecasts anything.
PID_TREND_MIN_SAMPLES = 6
PID_TREND_MIN_SECONDS = 300


@dataclass(frozen=True)
class FindingDraft:
    kind: str
    key: str
    severity: str
    title: str
    remedy: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "title", clip(self.title, _TITLE_MAX_CHARS))
        object.__setattr__(self, "remedy", clip(self.remedy, _REMEDY_MAX_CHARS))
        object.__setattr__(self, "key", self.key[:_KEY_MAX_CHARS])


@dataclass(frozen=True)
class Rising:
    """GPU memory that rose in ``samples`` snapshots without falling, since ``since``, from ``from_bytes``."""

    samples: int
    since: datetime | None
    from_bytes: int


@dataclass(frozen=True)
class PidSample:
    taken_at: datetime
    pids_in_use: int
    zombies: int


@dataclass(frozen=True)
class HistoryFacts:
    """What history says beside one snapshot (``history.findings_facts`` gathers it at ingest)."""

    taken_at: datetime
    # (pid, start_time_ticks) -> how its memory has been rising
    rising: dict[tuple[int, int], Rising] = field(default_factory=dict)
    # GPU uuid -> since when visible processes hold memory on it at 0% utilization
    idle_since: dict[str, datetime] = field(default_factory=dict)
    # The host's recent samples, oldest first (the last hour)
    pid_trend: tuple[PidSample, ...] = ()


def compute_findings(
    document: dict[str, Any], facts: HistoryFacts | None = None, *, rows: dict[int, ProcessRow] | None = None
) -> list[FindingDraft]:
    """Every finding the snapshot (and what history says beside it) supports, most urgent kinds first.

    ``rows``: the document's ``process_rows`` when the caller has them already (ingest)."""
    rows = process_rows(document) if rows is None else rows
    trees = zombie_trees(rows)
    drafts = [
        *gpu_data_unavailable(document),
        *gpu_health(document),
        *orphans_holding_gpu(rows),
        *uninterruptible_holding_gpu(rows, document),
        *unattributed_memory(document, rows),
        *over_attributed_memory(document, rows),
        *pid_exhaustion(document, trees),
    ]
    if facts is not None:
        drafts += [
            *pids_running_out(document, trees, facts),
            *suspected_leaks(rows, facts),
            *idle_holders(document, rows, facts),
        ]
    return [*drafts, *zombies(trees)]


# --- the kinds ------------------------------------------------------------


def zombies(trees: Iterable[ZombieTree]) -> list[FindingDraft]:
    """One finding per parent: only the parent can reap its zombies."""
    drafts = []
    for tree in trees:
        count = len(tree.zombies)
        parent = tree.parent
        if parent is not None:
            who = describe(parent)
            key = f"{parent.pid}:{parent.start_time_ticks}"
        else:
            who = f"pid {tree.parent_pid} (not in the snapshot)"
            key = f"{tree.parent_pid}:?"
        drafts.append(
            FindingDraft(
                kind=Kind.ZOMBIES,
                key=key,
                severity=_zombie_severity(count),
                title=f"{_plural(count, 'zombie')} under {who}",
                remedy=_zombie_remedy(tree),
                details={
                    "parent_pid": tree.parent_pid,
                    "parent_start_time_ticks": parent.start_time_ticks if parent else None,
                    "parent_user": parent.user if parent else None,
                    "parent_name": parent.name if parent else None,
                    "parent_elapsed_seconds": parent.elapsed_seconds if parent else None,
                    "zombie_count": count,
                    "zombie_pids": [z.pid for z in tree.zombies[:_DETAIL_PIDS_MAX]],
                },
            )
        )
    return drafts


def _zombie_severity(count: int) -> str:
    if count >= ZOMBIES_CRITICAL_COUNT:
        return Severity.CRITICAL
    if count >= ZOMBIES_WARNING_COUNT:
        return Severity.WARNING
    return Severity.INFO


def _zombie_remedy(tree: ZombieTree) -> str:
    futile = "kill -9 on a zombie does nothing: it is already dead."
    if tree.parent_pid == 1:
        return (
            "PID 1 is not reaping its children: run the container with an init that reaps "
            f"(docker run --init, tini), or check the host's init. {futile}"
        )
    parent = f"pid {tree.parent_pid}"
    if tree.parent is not None:
        parent = f"{_clean(tree.parent.name)} ({parent})"
    return (
        f"Only the parent can reap them: make {parent} call wait()/waitpid() (or handle SIGCHLD); "
        f"if it is a disposable job, end the parent and init reaps them. {futile}"
    )


def orphans_holding_gpu(rows: dict[int, ProcessRow]) -> list[FindingDraft]:
    """Orphans holding GPU memory or a device file, grouped by the leader they lost."""
    groups: dict[tuple[str, int], list[ProcessRow]] = defaultdict(list)
    for row in orphans(rows):
        groups[_lost_leader(row, rows)].append(row)
    drafts = []
    for (leader_kind, leader_pid), members in groups.items():
        memory_bytes = sum(r.total_gpu_memory_bytes for r in members)
        count = len(members)
        holds = "hold" if count != 1 else "holds"
        if memory_bytes:
            what = f"{human_bytes(memory_bytes)} of GPU memory"
        elif any(r.gpu_memory_bytes for r in members):
            what = "GPU memory (amount unknown)"
        else:
            what = f"{_clean(_first_device(members))} open"
        launcher = f"launcher {leader_pid}" if leader_kind != "pid" else f"pid {leader_pid}"
        users = sorted({r.user or (f"uid {r.uid}" if r.uid is not None else "unknown user") for r in members})
        owner = f" ({_clean(', '.join(users))})" if users else ""
        pids = [r.pid for r in members]
        drafts.append(
            FindingDraft(
                kind=Kind.ORPHAN_GPU,
                key=f"{leader_kind}:{leader_pid}",
                severity=Severity.CRITICAL if memory_bytes else Severity.WARNING,
                title=f"{_plural(count, 'orphan')} of {launcher}{owner} {holds} {what}",
                remedy=(
                    f"Leftovers of a dead launcher ({leader_kind} {leader_pid} is gone): they free nothing "
                    f"until they exit, so file a kill request for {_pid_list(pids)} "
                    "(SIGINT, then SIGTERM, then SIGKILL)."
                ),
                details={
                    "leader": leader_kind,
                    "leader_pid": leader_pid,
                    "pids": pids[:_DETAIL_PIDS_MAX],
                    "targets": [[r.pid, r.start_time_ticks] for r in members[:_DETAIL_PIDS_MAX]],
                    "gpu_memory_bytes": memory_bytes,
                },
            )
        )
    return drafts


def _lost_leader(row: ProcessRow, rows: dict[int, ProcessRow]) -> tuple[str, int]:
    """The process group (else session) leader an orphan outlived: it names the dead launcher.

    A leader absent from the snapshot (or a zombie) is the one that is gone;
    when the snapshot cannot tell, the process group wins: launchers such as
    torchrun share theirs with their workers.
    """
    candidates = [
        (name, leader)
        for name, leader in (("pgid", row.pgid), ("sid", row.sid))
        if leader is not None and leader not in (0, row.pid)
    ]
    for name, leader in candidates:
        if leader not in rows or rows[leader].is_zombie:
            return name, leader
    return candidates[0] if candidates else ("pid", row.pid)


def _first_device(rows: Iterable[ProcessRow]) -> str:
    return next((f for r in rows for f in r.device_files), "a GPU device")


def uninterruptible_holding_gpu(rows: dict[int, ProcessRow], document: dict[str, Any] | None = None
                                ) -> list[FindingDraft]:
    drafts = []
    stuck = [r for r in rows.values() if r.is_uninterruptible and r.holds_gpu]
    # What each waits on, where the probe could read it (a record's wchan / kernel_stack).
    waits = {r["pid"]: r for r in (document or {}).get("processes", ())
             if "wchan" in r or "kernel_stack" in r}
    for row in sorted(stuck, key=lambda r: r.pid):
        memory_bytes = row.total_gpu_memory_bytes
        holding = f"holding {human_bytes(memory_bytes)}" if memory_bytes else "holding a GPU"
        wait = waits.get(row.pid, {})
        if wait.get("wchan"):
            holding += f", waiting in {_clean(wait['wchan'])}"
        drafts.append(
            FindingDraft(
                kind=Kind.UNINTERRUPTIBLE_GPU,
                key=f"{row.pid}:{row.start_time_ticks}",
                severity=Severity.WARNING,
                title=f"{describe(row)} is in uninterruptible sleep (D) {holding}",
                remedy=(
                    "Signals wait until its kernel call returns, so killing it again is pointless: "
                    "check the storage and NFS mounts it may wait on and the GPU driver "
                    "(dmesg | grep -e NVRM -e Xid); if it never leaves D state, reboot the host."
                ),
                details={
                    "pid": row.pid,
                    "start_time_ticks": row.start_time_ticks,
                    "user": row.user,
                    "gpu_memory_bytes": memory_bytes,
                    "wchan": wait.get("wchan"),
                    "kernel_stack": wait.get("kernel_stack"),
                },
            )
        )
    return drafts


def unattributed_memory(document: dict[str, Any], rows: dict[int, ProcessRow]) -> list[FindingDraft]:
    """Per GPU: used memory that no process visible on the host accounts for."""
    threshold_bytes = settings.GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES
    attributed = defaultdict(int, attributed_memory_bytes(rows))
    unmatched: dict[str, list[int]] = defaultdict(list)
    for entry in document.get("unmatched_gpu_processes", ()):
        unmatched[entry["gpu_uuid"]].append(entry["pid"])
    drafts = []
    for gpu in document.get("gpus", ()):
        used_bytes = gpu["memory_used_bytes"]
        if used_bytes is None:
            continue
        unattributed_bytes = used_bytes - attributed[gpu["uuid"]]
        if unattributed_bytes <= threshold_bytes:
            continue
        index = gpu["index"]
        pids = sorted(unmatched[gpu["uuid"]])
        suspects = hidden_container_suspects(rows, index)
        if pids:
            where = f"The GPU reports {_pid_list(pids)}, which this host's /proc does not show"
        else:
            where = "No process on this host accounts for it"
        if suspects:
            where += (
                f": look in {workload_list(suspects)}, whose processes hold the GPU's device files "
                "but show no memory (the driver lists them under their container's PID namespace)."
            )
        elif pids:
            where += ": find the container (another PID namespace) that runs them."
        else:
            where += ": look for a container in another PID namespace."
        total_bytes = gpu["memory_total_bytes"]
        critical = bool(total_bytes) and unattributed_bytes * 2 > total_bytes
        drafts.append(
            FindingDraft(
                kind=Kind.UNATTRIBUTED_MEMORY,
                key=gpu["uuid"],
                severity=Severity.CRITICAL if critical else Severity.WARNING,
                title=(
                    f"GPU {index} ({_clean(gpu['name'])}): {human_bytes(unattributed_bytes)} "
                    f"used by no visible process ({human_bytes(used_bytes)} used against "
                    f"{human_bytes(attributed[gpu['uuid']])} by visible processes)"
                ),
                remedy=(
                    f"{where} Otherwise the driver may be stuck (dmesg for NVRM/Xid): reload nvidia_uvm, "
                    f"run nvidia-smi --gpu-reset -i {index}, or reboot."
                ),
                details={
                    "gpu_uuid": gpu["uuid"],
                    "gpu_index": index,
                    "memory_used_bytes": used_bytes,
                    "memory_attributed_bytes": attributed[gpu["uuid"]],
                    "memory_unattributed_bytes": unattributed_bytes,
                    "unmatched_pids": pids[:_DETAIL_PIDS_MAX],
                    "suspect_containers": [{"key": w.key, "label": w.label} for w in suspects],
                },
            )
        )
    return drafts


def over_attributed_memory(document: dict[str, Any], rows: dict[int, ProcessRow]) -> list[FindingDraft]:
    """Per GPU: processes said to hold more memory than the GPU says is used.

    No real GPU can: the per-process figures and the GPU's total come from two
    readings of the driver, so either they were taken across a large free, or
    the agent (or whatever signs as it) reports numbers that cannot be trusted.
    Every figure shown for this GPU is then suspect, so the panel says so instead of
    showing an unattributed amount below zero as zero."""
    attributed = attributed_memory_bytes(rows)
    drafts = []
    for gpu in document.get("gpus", ()):
        used_bytes = gpu["memory_used_bytes"]
        attributed_bytes = attributed.get(gpu["uuid"], 0)
        if used_bytes is None or attributed_bytes <= used_bytes:
            continue
        index = gpu["index"]
        drafts.append(
            FindingDraft(
                kind=Kind.OVER_ATTRIBUTED_MEMORY,
                key=gpu["uuid"],
                severity=Severity.WARNING,
                title=(
                    f"GPU {index} ({_clean(gpu['name'])}): processes hold {human_bytes(attributed_bytes)}, "
                    f"more than the {human_bytes(used_bytes)} the GPU reports used"
                ),
                remedy=(
                    "The host's figures contradict each other: compare nvidia-smi's process list with its "
                    "memory total on the host. If it persists, the agent's GPU backend misreads the driver "
                    "(or something else signs as the host): check the agent's version and the host's key."
                ),
                details={
                    "gpu_uuid": gpu["uuid"],
                    "gpu_index": index,
                    "memory_used_bytes": used_bytes,
                    "memory_attributed_bytes": attributed_bytes,
                    "memory_over_attributed_bytes": attributed_bytes - used_bytes,
                },
            )
        )
    return drafts


# XIDs an admin acts on: what each means, how urgent, the way out (NVIDIA's XID catalogue).
XID_MEANINGS: dict[int, tuple[str, str, str]] = {
    79: ("the GPU has fallen off the bus", Severity.CRITICAL,
         "The driver lost the GPU: drain the host and reboot it (a GPU reset rarely brings it back); if it "
         "recurs, check the GPU's power, cooling and slot, then replace it."),
    48: ("double-bit ECC error", Severity.CRITICAL,
         "An uncorrectable memory error: the processes using that memory were stopped or got bad data; "
         "restart them after the GPU is reset when idle (or the host rebooted), which retires the memory."),
    63: ("memory page retirement or row remapping recorded", Severity.WARNING,
         "The GPU took bad memory out of use (takes effect at the next reset): reset the GPU when it is "
         "idle; if it repeats, plan to replace it."),
    64: ("memory page retirement or row remapping failed", Severity.CRITICAL,
         "The GPU could not record bad memory: drain it, reset it when idle, and replace it if this recurs."),
    94: ("contained ECC error", Severity.WARNING,
         "An uncorrectable memory error stopped only the applications using that memory: restart them; "
         "reset the GPU when idle so the bad row is remapped."),
    95: ("uncontained ECC error", Severity.CRITICAL,
         "An uncorrectable memory error could not be contained: every process on the GPU is affected; "
         "drain it and reset the GPU (or reboot the host)."),
}
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")
POWER_BRAKE_REASON = "hw_power_brake_slowdown"
HW_SLOWDOWN_REASON = "hw_slowdown"  # set beside either hardware cause, or alone for one NVML does not name


def gpu_health(document: dict[str, Any]) -> list[FindingDraft]:
    """Per GPU, each health condition an admin acts on (keys ``<uuid>:<condition>``); a field the GPU
    could not give (null) shows nothing, never a condition."""
    drafts: list[FindingDraft] = []
    for gpu in document.get("gpus", ()):
        health = gpu.get("health")
        if health:
            drafts += _health_of(gpu, health)
    return drafts


def _health_of(gpu: dict[str, Any], health: dict[str, Any]) -> list[FindingDraft]:
    index, uuid = gpu["index"], gpu["uuid"]
    label = f"GPU {index}"
    reset = f"nvidia-smi -r -i {index}"
    seen: dict[str, Any] = {"gpu_uuid": uuid, "gpu_index": index}
    drafts = []

    def found(condition: str, severity: str, title: str, remedy: str, **details: Any) -> None:
        drafts.append(FindingDraft(kind=Kind.GPU_HEALTH, key=f"{uuid}:{condition}", severity=severity,
                                   title=f"{label}: {title}", remedy=remedy,
                                   details={**seen, "condition": condition, **details}))

    remapped = {k: health.get(f"remapped_rows_{k}")
                for k in ("correctable", "uncorrectable", "pending", "failed")}
    rows_seen = (f"{_plural(remapped['uncorrectable'], 'row')} remapped for uncorrectable errors, "
                 f"{remapped['correctable']} for correctable"
                 if remapped["uncorrectable"] is not None and remapped["correctable"] is not None else "")
    if remapped["failed"]:
        found("row_remapping_failed", Severity.CRITICAL,
              f"row remapping failed{f' ({rows_seen})' if rows_seen else ''}",
              "The GPU has no spare memory rows left for bad ones: drain it and replace it (RMA).",
              **{f"remapped_rows_{k}": v for k, v in remapped.items()})
    if remapped["pending"]:
        found("row_remapping_pending", Severity.WARNING,
              f"row remapping pending{f' ({rows_seen})' if rows_seen else ''}",
              f"Bad memory rows are remapped only at the next reset: reset the GPU when it is idle ({reset}) "
              "or reboot the host; until then that memory may still be used.",
              **{f"remapped_rows_{k}": v for k, v in remapped.items()})
    if health.get("retired_pages_pending"):
        pages = [health.get("retired_pages_single_bit_ecc"), health.get("retired_pages_double_bit_ecc")]
        counted = (f" ({pages[1]} double-bit, {pages[0]} single-bit pages retired)"
                   if None not in pages else "")
        found("page_retirement_pending", Severity.WARNING, f"memory page retirement pending{counted}",
              f"Retired pages leave use only at the next reset: reset the GPU when it is idle ({reset}) "
              "or reboot the host.",
              retired_pages_single_bit_ecc=pages[0], retired_pages_double_bit_ecc=pages[1])
    volatile = health.get("ecc_volatile_uncorrected_errors")
    if volatile:
        aggregate = health.get("ecc_aggregate_uncorrected_errors")
        lifetime = f", {aggregate} over its lifetime" if aggregate is not None else ""
        found("uncorrectable_ecc", Severity.CRITICAL,
              f"{_plural(volatile, 'uncorrectable ECC error')} since the last reset{lifetime}",
              "Applications using the bad memory got wrong data or were stopped: restart them after a reset "
              f"when idle ({reset}); if the lifetime count keeps rising, replace the GPU.",
              ecc_volatile_uncorrected_errors=volatile, ecc_aggregate_uncorrected_errors=aggregate)
    _throttling(health, found)
    for entry in health.get("xid_errors") or ():
        xid, count = entry["xid"], entry["count"]
        meaning, severity, remedy = XID_MEANINGS.get(xid, (
            "a driver error", Severity.INFO,
            "See NVIDIA's XID catalogue for this number and the kernel log (dmesg | grep -e NVRM -e Xid); "
            "XIDs 13, 31 and 43 are usually the application's own fault."))
        found(f"xid_{xid}", severity,
              f"XID {xid}, {meaning} ({_plural(count, 'time')}, last at {entry['last_seen_at']})",
              remedy, xid=xid, count=count, last_seen_at=entry["last_seen_at"])
    return drafts


def _throttling(health: dict[str, Any], found: Callable[..., None]) -> None:
    reasons = health.get("clock_event_reasons") or ()
    temperature = health.get("temperature_celsius")
    draw, limit = health.get("power_draw_milliwatts"), health.get("power_limit_milliwatts")
    thermal = [r for r in reasons if r in THERMAL_REASONS]
    if thermal:
        hot = f" at {temperature} °C" if temperature is not None else ""
        found("thermal_throttling", Severity.WARNING,
              f"clocks slowed down by heat{hot} ({', '.join(r.replace('_', ' ') for r in thermal)})",
              "Check the host's airflow, fans and inlet temperature; a GPU hotter than its neighbours "
              "may need its cooling serviced.",
              reasons=thermal, temperature_celsius=temperature)
    power = POWER_BRAKE_REASON in reasons or (HW_SLOWDOWN_REASON in reasons and not thermal)
    if power:
        known = draw is not None and limit is not None
        watts = f" at {watts_text(draw)} of {watts_text(limit)}" if known else ""
        cause = "power brake" if POWER_BRAKE_REASON in reasons else "hardware slowdown"
        found("power_throttling", Severity.WARNING,
              f"clocks slowed down by the power supply{watts} ({cause})",
              "The hardware cut the clocks for power: check the host's power supplies and the rack's power "
              "budget (the power-brake signal), and that the GPU's power cables are seated.",
              reasons=[r for r in reasons if r in (POWER_BRAKE_REASON, HW_SLOWDOWN_REASON)],
              power_draw_milliwatts=draw, power_limit_milliwatts=limit)


def watts_text(milliwatts: int | None) -> str:
    """NVML's milliwatts as people read power: whole watts."""
    return "? W" if milliwatts is None else f"{milliwatts / 1000:.0f} W"


def hidden_container_suspects(rows: dict[int, ProcessRow], gpu_index: int) -> list[Workload]:
    """Containers and pods that may hold a GPU's unattributed memory, by what the snapshot shows.

    The evidence: a process the host sees in a container or pod holds this GPU's device file
    (``/dev/nvidia<index>``, or only the shared ``nvidiactl``/``nvidia-uvm`` files, which name no GPU)
    yet no GPU memory is attributed to it. A CUDA process holds its GPU's device files; when the
    driver reports its memory under a PID the host's /proc does not have (its container's PID
    namespace), that memory is what nobody accounts for. An agent that cannot read those processes'
    open files (no CAP_SYS_PTRACE) sees no device files and names no container.
    """
    own_device = f"/dev/nvidia{gpu_index}"
    found: dict[str, Workload] = {}
    for row in rows.values():
        # The cheap tests first: most processes hold no device file, and this runs per GPU.
        if not row.device_files or row.total_gpu_memory_bytes:
            continue
        workload = row.workload
        if workload is None or workload.kind == SLURM_JOB:
            continue
        numbered = [f for f in row.device_files if f.removeprefix("/dev/nvidia").isdigit()]
        if numbered and own_device not in numbered:
            continue
        found[workload.key] = workload
    return sorted(found.values(), key=lambda w: (w.label.casefold(), w.key))


def workload_list(workloads: list[Workload]) -> str:
    listed = workloads[:_CONTAINERS_LISTED_MAX]
    shown = ", ".join(_clean(clip(w.label, _COMMAND_SHOWN_MAX_CHARS)) for w in listed)
    more = len(workloads) - _CONTAINERS_LISTED_MAX
    return shown + (f" and {more} more" if more > 0 else "")


def pid_exhaustion(document: dict[str, Any], trees: list[ZombieTree]) -> list[FindingDraft]:
    """PIDs in use above GPUADMIN_PID_USAGE_WARN_RATIO of pid_max (strictly above)."""
    pid_max = document["host"]["pid_max"]
    in_use = document["host"]["pids_in_use"]
    usage = Fraction(in_use, pid_max)
    if usage <= Fraction(str(settings.GPUADMIN_PID_USAGE_WARN_RATIO)):
        return []
    culprit = ""
    top = trees[0] if trees else None
    if top is not None and top.parent is not None:
        culprit = (
            f" Most zombies ({len(top.zombies)}) are under {_clean(top.parent.name)} (pid {top.parent_pid})."
        )
    return [
        FindingDraft(
            kind=Kind.PID_EXHAUSTION,
            key="pids",
            severity=Severity.CRITICAL if usage > PID_USAGE_CRITICAL_RATIO else Severity.WARNING,
            title=f"{in_use:,} of {pid_max:,} PIDs in use ({float(usage) * 100:.1f}%)",
            remedy=(
                "New processes fail with EAGAIN (errno 11) when PIDs run out: find the parent holding "
                f"zombies (reap or end it) or the fork bomb.{culprit}"
            ),
            details={"pids_in_use": in_use, "pid_max": pid_max},
        )
    ]


def gpu_data_unavailable(document: dict[str, Any]) -> list[FindingDraft]:
    backend = document["gpu_backend"]
    if backend["available"]:
        return []
    reason = backend["reason"] or "no reason given"
    return [
        FindingDraft(
            kind=Kind.GPU_DATA_UNAVAILABLE,
            key=backend["name"],
            severity=Severity.WARNING,
            title=f"GPU data unavailable ({backend['name']} backend): {_clean(reason)}",
            remedy=(
                "Install the NVIDIA driver and nvidia-ml-py on the host, and let the agent's user open "
                "/dev/nvidia* and load libnvidia-ml; until then GPU memory and its holders are unknown."
            ),
            details={"backend": backend["name"], "reason": backend["reason"]},
        )
    ]


def suspected_leaks(rows: dict[int, ProcessRow], facts: HistoryFacts) -> list[FindingDraft]:
    """Processes whose GPU memory rose in GPUADMIN_LEAK_RISING_SAMPLES snapshots without falling."""
    needed = settings.GPUADMIN_LEAK_RISING_SAMPLES
    drafts = []
    # Only the few processes whose memory is rising are sorted, not the whole snapshot.
    candidates = [r for r in rows.values() if (r.pid, r.start_time_ticks) in facts.rising]
    for row in sorted(candidates, key=lambda r: r.pid):
        rising = facts.rising[(row.pid, row.start_time_ticks)]
        if rising.samples < needed or not row.total_gpu_memory_bytes:
            continue
        now_bytes = row.total_gpu_memory_bytes
        drafts.append(
            FindingDraft(
                kind=Kind.SUSPECTED_LEAK,
                key=f"{row.pid}:{row.start_time_ticks}",
                severity=Severity.WARNING,
                title=(
                    f"GPU memory of {describe(row)} keeps rising: {human_bytes(rising.from_bytes)} to "
                    f"{human_bytes(now_bytes)} over {rising.samples} snapshots"
                ),
                remedy=(
                    "A leak climbs, a cache plateaus: its chart on the process page tells which. If it keeps "
                    "climbing, ask its owner to fix or restart it before the GPU runs out of memory for "
                    "everyone; request a kill only if it must go now."
                ),
                details={
                    "pid": row.pid,
                    "start_time_ticks": row.start_time_ticks,
                    "user": row.user,
                    "rising_samples": rising.samples,
                    "rising_since": utc_text(rising.since, timespec="seconds"),
                    "from_bytes": rising.from_bytes,
                    "gpu_memory_bytes": now_bytes,
                },
            )
        )
    return drafts


def idle_holders(
    document: dict[str, Any], rows: dict[int, ProcessRow], facts: HistoryFacts
) -> list[FindingDraft]:
    """Per GPU: memory held by visible processes at 0% utilization for GPUADMIN_IDLE_HOLDER_SECONDS."""
    threshold = timedelta(seconds=settings.GPUADMIN_IDLE_HOLDER_SECONDS)
    drafts = []
    for gpu in document.get("gpus", ()):
        since = facts.idle_since.get(gpu["uuid"])
        if since is None or facts.taken_at - since < threshold:
            continue
        holders = sorted(
            (r for r in rows.values() if (r.gpu_memory_bytes.get(gpu["uuid"]) or 0) > 0),
            key=lambda r: (-(r.gpu_memory_bytes.get(gpu["uuid"]) or 0), r.pid),
        )
        if not holders:
            continue
        held_bytes = sum(r.gpu_memory_bytes.get(gpu["uuid"]) or 0 for r in holders)
        others = f" and {_plural(len(holders) - 1, 'other')}" if len(holders) > 1 else ""
        idle_for = human_duration((facts.taken_at - since).total_seconds())
        drafts.append(
            FindingDraft(
                kind=Kind.IDLE_HOLDER,
                key=gpu["uuid"],
                severity=Severity.WARNING,
                title=(
                    f"GPU {gpu['index']}: {human_bytes(held_bytes)} held by {describe(holders[0])}{others} "
                    f"at 0% utilization for {idle_for}"
                ),
                remedy=(
                    "Memory nobody computes with: often a notebook kernel, a stopped debugger or a job "
                    "waiting on input. Ask its owner to free it; if the owner is gone, request a kill of "
                    f"{_pid_list([r.pid for r in holders])}."
                ),
                details={
                    "gpu_uuid": gpu["uuid"],
                    "gpu_index": gpu["index"],
                    "idle_since": utc_text(since, timespec="seconds"),
                    "pids": [r.pid for r in holders[:_DETAIL_PIDS_MAX]],
                    "targets": [[r.pid, r.start_time_ticks] for r in holders[:_DETAIL_PIDS_MAX]],
                    "gpu_memory_bytes": held_bytes,
                },
            )
        )
    return drafts


def pid_forecast(trend: Iterable[PidSample], pid_max: int) -> tuple[float, datetime] | None:
    """(PIDs per second, when pid_max is reached) from a least-squares line through the samples;
    None when the trend is too short, not rising, or rising so slowly that pid_max lies past any date."""
    samples = list(trend)
    if len(samples) < PID_TREND_MIN_SAMPLES:
        return None
    t0 = samples[0].taken_at
    xs = [(s.taken_at - t0).total_seconds() for s in samples]
    if xs[-1] - xs[0] < PID_TREND_MIN_SECONDS:
        return None
    ys = [s.pids_in_use for s in samples]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    if slope <= 0:
        return None
    last = samples[-1]
    try:
        return slope, last.taken_at + timedelta(seconds=max(0, pid_max - last.pids_in_use) / slope)
    except OverflowError:  # a line all but flat (a rounding's worth of slope) never reaches pid_max
        return None


def zombies_grew(oldest: int, newest: int) -> bool:
    """Whether a host's zombies grew over the PID trend's window: else PIDs are not running out
    (``pids_running_out``), and ingest need not read the trend (``history.findings_facts``)."""
    return newest > oldest


def pids_running_out(
    document: dict[str, Any], trees: list[ZombieTree], facts: HistoryFacts
) -> list[FindingDraft]:
    """Zombies growing and PIDs in use rising fast enough to reach pid_max within the horizon."""
    trend = facts.pid_trend
    if len(trend) < 2 or not zombies_grew(trend[0].zombies, trend[-1].zombies):
        return []
    pid_max = document["host"]["pid_max"]
    forecast = pid_forecast(trend, pid_max)
    if forecast is None:
        return []
    per_second, reached_at = forecast
    left = (reached_at - facts.taken_at).total_seconds()
    if left > settings.GPUADMIN_PID_FORECAST_HORIZON_SECONDS:
        return []
    culprit = ""
    top_parent = trees[0].parent if trees else None
    if top_parent is not None:
        culprit = f" Most zombies ({len(trees[0].zombies)}) are under {describe(top_parent)}: reap or end it."
    return [
        FindingDraft(
            kind=Kind.PIDS_RUNNING_OUT,
            key="pids-forecast",
            severity=Severity.CRITICAL if left < 3600 else Severity.WARNING,
            title=(
                f"PIDs running out: zombies grew from {trend[0].zombies:,} to {trend[-1].zombies:,}; at "
                f"{per_second * 3600:,.0f} PIDs an hour, pid_max ({pid_max:,}) is reached in about "
                f"{human_duration(left)} ({utc_text(reached_at, timespec='minutes')})"
            ),
            remedy=(
                "When PIDs run out nothing new starts (fork fails with EAGAIN), logins included: find the "
                f"parent that does not reap its children.{culprit}"
            ),
            details={
                "zombies_from": trend[0].zombies,
                "zombies_now": trend[-1].zombies,
                "pids_per_hour": round(per_second * 3600, 1),
                "pid_max": pid_max,
                "forecast_at": utc_text(reached_at, timespec="seconds"),
            },
        )
    ]


# Where each kind's details name the processes it is about (the process page lists its findings).
_PROCESS_DETAIL_KEYS = (("pid", "start_time_ticks"), ("parent_pid", "parent_start_time_ticks"))


def mentions_process(details: dict[str, Any], pid: int, start_time_ticks: int) -> bool:
    """Whether a finding's details name this process (as itself, a zombie parent or one of its targets)."""
    for pid_key, start_key in _PROCESS_DETAIL_KEYS:
        if details.get(pid_key) == pid and details.get(start_key) == start_time_ticks:
            return True
    return [pid, start_time_ticks] in (details.get("targets") or [])


# --- wording --------------------------------------------------------------


def describe(row: ProcessRow) -> str:
    """``python train.py (pid 4120, alice)``: a process as a person recognises it."""
    command = clip(_clean(row.command_line), _COMMAND_SHOWN_MAX_CHARS)
    owner = row.user if row.user else (f"uid {row.uid}" if row.uid is not None else "unknown user")
    return f"{command} (pid {row.pid}, {_clean(owner)})"


def _clean(text: str) -> str:
    """Text from a process, safe to quote in a title: no control or bidi-override characters."""
    return "".join(
        " " if ch.isspace() else ("\ufffd" if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co") else ch)
        for ch in text
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _pid_list(pids: list[int]) -> str:
    shown = ", ".join(str(p) for p in pids[:_PIDS_LISTED_MAX])
    more = f" and {len(pids) - _PIDS_LISTED_MAX} more" if len(pids) > _PIDS_LISTED_MAX else ""
    return f"pid{'s' if len(pids) != 1 else ''} {shown}{more}"
