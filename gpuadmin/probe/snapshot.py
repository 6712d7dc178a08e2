"""One reading of the host: the snapshot document (docs/snapshot.md).

The whole process table is read (cheaply, /proc/<pid>/stat and the open-file
links); only the processes that matter are described in full: GPU-memory
holders, device-file holders, zombies, D-state processes, their ancestors up
to PID 1 and their descendants, each with its owner (job, container, pod,
unit). The rest are counted.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from datetime import UTC, datetime

from gpuadmin.probe.config import ProbeConfig
from gpuadmin.probe.devices import DeviceMatcher, DeviceScan, scan_device_holders
from gpuadmin.probe.gpus import GpuProcess, drop_impossible_pids, read_gpus
from gpuadmin.probe.host import host_facts
from gpuadmin.probe.owners import OwnerResolver
from gpuadmin.probe.processes import (
    UNINTERRUPTIBLE,
    describe,
    list_pids,
    read_stats,
    read_uptime_seconds,
)
from gpuadmin.probe.procfs import StatFields, process_state, read_cmdline_bytes, read_pid_max

# The newest version in snapshot.schema.json's schema_version enum (tests hold the two together).
SCHEMA_VERSION = 2
REASONS = ("gpu", "device", "zombie", "uninterruptible", "ancestor", "descendant")


def take_snapshot(config: ProbeConfig | None = None) -> dict[str, object]:
    config = config if config is not None else ProbeConfig.from_env()
    started = time.perf_counter()
    taken_at = datetime.now(UTC)
    gpu_state = read_gpus(config)
    uptime_seconds = read_uptime_seconds()
    stats, devices = scan_host(DeviceMatcher(config.device_glob))
    gpu_state = drop_impossible_pids(gpu_state, pid_max=read_pid_max(), live_pids=stats.keys())

    reasons = processes_that_matter(stats, devices, gpu_state.processes)
    if config.include_all:
        for pid in stats:
            reasons.setdefault(pid, ["all"])
    gpu_memory, mig_instances, unmatched = match_gpu_processes(gpu_state.processes, stats)
    listed = {gpu.uuid for gpu in gpu_state.gpus}
    utilization: dict[int, dict[str, int]] = defaultdict(dict)
    for figure in gpu_state.process_utilization:
        if figure.gpu_uuid in listed:
            utilization[figure.pid][figure.gpu_uuid] = figure.percent

    owners = OwnerResolver(config.runtime_paths)
    sessions = session_members(stats)
    rows = []
    for pid in sorted(reasons):
        stat = stats[pid]
        row = describe(stat, uptime_seconds=uptime_seconds, cmdline_max_bytes=config.cmdline_max_bytes)
        owner = owners.owner_of(pid, stats)
        row["container_id"] = owner.container_id if owner is not None else None
        row["owner"] = owner.as_document() if owner is not None else None
        row["orphaned"] = is_orphaned(stat, stats, sessions)
        row["reasons"] = reasons[pid]
        row["gpu_memory_bytes"] = gpu_memory.get(pid, {})
        if pid in utilization:
            row["gpu_utilization_percent"] = utilization[pid]
        if pid in mig_instances:
            row["mig_instances"] = mig_instances[pid]
        row["device_files"] = devices.holders.get(pid, [])
        rows.append(row)

    zombies = sum(1 for s in stats.values() if s.zombie)
    uninterruptible = sum(1 for s in stats.values() if process_state(s) == UNINTERRUPTIBLE)
    return {
        "schema_version": SCHEMA_VERSION,
        "host": host_facts(
            config.host_name, pids_fallback=len(stats), driver_version=gpu_state.driver_version
        ),
        "taken_at": taken_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "probe_duration_seconds": round(time.perf_counter() - started, 6),
        "scope": "all" if config.include_all else "matters",
        "device_glob": config.device_glob,
        "device_scan_denied_processes": devices.denied_pids,
        "gpu_backend": gpu_state.backend_document(),
        "gpus": [gpu.as_document() for gpu in gpu_state.gpus],
        "processes": rows,
        "process_counts": {
            "total": len(stats),
            "zombies": zombies,
            "uninterruptible": uninterruptible,
            "omitted": len(stats) - len(rows),
        },
        "unmatched_gpu_processes": unmatched,
    }


def scan_host(matcher: DeviceMatcher) -> tuple[dict[int, StatFields], DeviceScan]:
    """Every process's stat, and the device files each live one holds.

    One thread on purpose: the pass is a long run of short /proc system calls,
    and two threads spend more handing the GIL back and forth than they gain
    (measured with benchmarks/probe_vs_manual.py on a 2-CPU VM).
    """
    stats = read_stats(list_pids())
    agent = agent_processes(stats)
    # Zombies and kernel threads have no open files to look at; the agent's own files are NVML's.
    live = [pid for pid, s in stats.items() if not s.zombie and not s.kernel_thread and pid not in agent]
    return stats, scan_device_holders(live, matcher)


def agent_processes(stats: dict[int, StatFields]) -> set[int]:
    """This process and its fork siblings running the same command line: a Celery worker's
    other pool processes. Each one that ever probed keeps its own NVML session, so holds
    /dev/nvidiactl and /dev/nvidia<N> open; they are the agent, not device holders."""
    me = os.getpid()
    own = stats.get(me)
    if own is None:
        return {me}
    command_line = read_cmdline_bytes(me)
    siblings = {
        pid for pid, stat in stats.items()
        if stat.ppid == own.ppid and pid != me and not stat.zombie
        and read_cmdline_bytes(pid) == command_line
    }
    return {me, *siblings}


def processes_that_matter(stats: dict[int, StatFields], devices: DeviceScan,
                          gpu_processes: tuple[GpuProcess, ...]) -> dict[int, list[str]]:
    """pid -> why it is in the snapshot, in REASONS order."""
    found: dict[int, set[str]] = defaultdict(set)
    for holder in gpu_processes:
        if holder.pid in stats:
            found[holder.pid].add("gpu")
    for pid in devices.holders:
        if pid in stats:
            found[pid].add("device")
    for pid, stat in stats.items():
        if stat.zombie:
            found[pid].add("zombie")
        elif process_state(stat) == UNINTERRUPTIBLE:
            found[pid].add("uninterruptible")
    seeds = list(found)

    for pid in seeds:
        parent = stats[pid].ppid
        # Stop at a parent already marked: the rest of its chain was walked then.
        while parent in stats and "ancestor" not in found[parent]:
            found[parent].add("ancestor")
            parent = stats[parent].ppid

    children: dict[int, list[int]] = defaultdict(list)
    for pid, stat in stats.items():
        children[stat.ppid].append(pid)
    pending = [child for pid in seeds for child in children.get(pid, ())]
    while pending:
        pid = pending.pop()
        if "descendant" in found[pid]:
            continue
        found[pid].add("descendant")
        pending.extend(children.get(pid, ()))

    return {pid: [r for r in REASONS if r in why] for pid, why in found.items()}


def match_gpu_processes(
    gpu_processes: tuple[GpuProcess, ...], stats: dict[int, StatFields]
) -> tuple[dict[int, dict[str, int | None]], dict[int, list[dict[str, object]]], list[dict[str, object]]]:
    """GPU memory per live PID (by parent GPU), the MIG instances of each live PID, and
    the backend's PIDs that match no /proc entry here (another PID namespace, or gone):
    their memory stays in the GPU's used memory and shows as unattributed."""
    by_pid: dict[int, dict[str, int | None]] = defaultdict(dict)
    instances: dict[int, list[dict[str, object]]] = defaultdict(list)
    unmatched: list[dict[str, object]] = []
    for holder in gpu_processes:
        on_instance = holder.gpu_instance_id is not None and holder.compute_instance_id is not None
        where: dict[str, object] = {}
        if on_instance:
            where = {"gpu_instance_id": holder.gpu_instance_id,
                     "compute_instance_id": holder.compute_instance_id}
        if holder.pid not in stats:
            unmatched.append({
                "pid": holder.pid,
                "gpu_uuid": holder.gpu_uuid,
                "used_memory_bytes": holder.used_memory_bytes,
                **where,
            })
            continue
        memory = by_pid[holder.pid]
        if holder.gpu_uuid in memory:
            # A second MIG instance of the same GPU: the sum, unknown if either is unknown.
            before = memory[holder.gpu_uuid]
            used = holder.used_memory_bytes
            memory[holder.gpu_uuid] = None if before is None or used is None else before + used
        else:
            memory[holder.gpu_uuid] = holder.used_memory_bytes
        if on_instance:
            instances[holder.pid].append({
                "gpu_uuid": holder.gpu_uuid, **where, "used_memory_bytes": holder.used_memory_bytes,
            })
    return dict(by_pid), dict(instances), unmatched


def is_orphaned(stat: StatFields, stats: dict[int, StatFields],
                sessions: dict[int, list[int]] | None = None) -> bool:
    """Left behind by the process that started it (docs/snapshot.md, "Orphans").

    Re-parented (to PID 1, or to a subreaper in another session: a child starts
    in its parent's session, and only setsid, which makes it a leader, moves it)
    and not started to live on its own. Whether its group or session leader
    still lives does not matter: a Slurm batch script, torchrun's agent or a
    shell leads on while a launcher under it died and left its workers. Living
    on its own means leading its process group or session (a service, a job
    of a shell's job control, a `setsid` child), or the classic daemon's shape
    (fork, setsid, fork): in a session whose group is the session's, with
    nobody there but itself and its descendants.

    ``sessions`` (session id -> member pids, ``session_members``) is built
    once per snapshot; without it, it is built here.
    """
    if stat.pid == 1 or stat.kernel_thread:
        return False
    if stat.pgid <= 0 or stat.sid <= 0:  # leaders outside our PID namespace: a container's, unknown
        return False
    parent = stats.get(stat.ppid)
    reparented = stat.ppid == 1 or (parent is not None and parent.sid != stat.sid)
    if not reparented or stat.pid in (stat.pgid, stat.sid):
        return False
    if stat.pgid == stat.sid:
        members = (sessions if sessions is not None else session_members(stats)).get(stat.sid, [])
        if all(member == stat.pid or _descends_from(member, stat.pid, stats) for member in members):
            return False  # a detached daemon, alone in its session
    return True


def session_members(stats: dict[int, StatFields]) -> dict[int, list[int]]:
    """Session id -> the pids in it."""
    members: dict[int, list[int]] = defaultdict(list)
    for pid, stat in stats.items():
        members[stat.sid].append(pid)
    return members


def _descends_from(pid: int, ancestor: int, stats: dict[int, StatFields]) -> bool:
    # Bounded: stats read one by one can, in principle, chain a reused PID into a loop.
    for _ in range(len(stats)):
        stat = stats.get(pid)
        if stat is None or stat.ppid <= 1:
            return False
        if stat.ppid == ancestor:
            return True
        pid = stat.ppid
    return False
