"""The findings of the kills app, opened and closed here only.

"Unkillable": a target that outlived the whole plan (usually SIGKILL, stuck in
a kernel call) is a finding on its host from the agent's ``target_survived``
report until a later snapshot no longer shows that process (same boot, same
start time).

"Memory not released": a finished kill whose targets' GPU memory had not come
back after ``GPUADMIN_MEMORY_RELEASE_SNAPSHOTS`` snapshots (``memory_release.py``).
It names what still holds it, from the snapshot's memory explained
(``fleet/findings/memory_explained.py``), and the next step: kill the orphans, or
request a GPU reset for memory no process holds. It closes when a later
snapshot shows the memory back (``memory.release`` complete, against the same
baseline), or the host rebooted.

The fleet pages list them with the host's other findings.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from gpuadmin.fleet.findings.memory_explained import memory_explained
from gpuadmin.fleet.models import Finding, Host
from gpuadmin.fleet.process_tree import process_rows
from gpuadmin.fleet.storage.statements import Param, PreparedQuery
from gpuadmin.fleet.summary import refresh_host_summary
from gpuadmin.kills import memory
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget
from gpuadmin.text import human_bytes

# Asked after every snapshot of every host (resolve_gone_unkillable), almost always in vain: its SQL
# written once (fleet.storage.statements), not built by the ORM each time.
_ANY_OPEN_UNKILLABLE = PreparedQuery(
    Finding.objects.open().filter(host=Param(Finding, "host"), kind=Finding.Kind.UNKILLABLE)
    .order_by().values_list("pk")[:1]
)


def open_unkillable(kill_request: KillRequest, target: KillTarget, step: KillStep) -> None:
    """A process that outlived SIGKILL (or the whole plan) is a finding until a snapshot shows it gone."""
    now = timezone.now()
    key = f"{target.pid}:{target.start_time_ticks}"
    unkillable = Finding.objects.open().filter(host=kill_request.host, kind=Finding.Kind.UNKILLABLE)
    finding = unkillable.filter(key=key).first()
    details = {
        "pid": target.pid,
        "start_time_ticks": target.start_time_ticks,
        "boot_id": target.boot_id,
        "name": target.name,
        "user": target.user,
        "kill_request_id": kill_request.pk,
        "detail": step.detail,
        "state": step.raw.get("state"),
    }
    if finding:
        finding.last_seen_at = now
        finding.details = details
        finding.save(update_fields=["last_seen_at", "details"])
        return
    last = kill_request.plan[-1]["signal"] if kill_request.plan else "the last signal"
    Finding.objects.create(
        host=kill_request.host,
        kind=Finding.Kind.UNKILLABLE,
        key=key,
        severity=Finding.Severity.CRITICAL,
        title=f"PID {target.pid} ({target.name[:100]}) survived {last} (kill request #{kill_request.pk})",
        remedy=(
            "Usually stuck in a kernel call (state D): look for NVRM/Xid errors in the kernel log; "
            "reload the driver (nvidia_uvm), reset the GPU, or reboot the host."
        ),
        details=details,
        first_seen_at=now,
        last_seen_at=now,
    )
    refresh_host_summary(kill_request.host_id, now=now)  # the fleet page's worst finding


def resolve_gone_unkillable(host: Host, document: dict[str, Any], *,
                            open_kinds: Collection[str] | None = None, now: datetime | None = None) -> int:
    """Close "unkillable" findings whose process this snapshot no longer shows (same boot, same start).

    ``open_kinds``: the kinds of the host's open findings when the caller knows them (ingest read them
    with the snapshot, ``snapshot_ingested``); else they are asked for."""
    any_open = (Finding.Kind.UNKILLABLE in open_kinds if open_kinds is not None
                else bool(_ANY_OPEN_UNKILLABLE.rows(host=host.pk)))
    if not any_open:
        return 0  # the usual case: no need to read the snapshot's processes
    now = now or timezone.now()
    unkillable = list(Finding.objects.open().filter(host=host, kind=Finding.Kind.UNKILLABLE))
    rows = process_rows(document)
    boot_id = document.get("host", {}).get("boot_id")
    resolved = 0
    for finding in unkillable:
        pid = finding.details.get("pid")
        start = finding.details.get("start_time_ticks")
        row = rows.get(pid) if isinstance(pid, int) else None
        same_boot = finding.details.get("boot_id") in (None, boot_id)
        resolved += _seen_or_resolved(
            finding, still_open=same_boot and row is not None and row.start_time_ticks == start, now=now)
    return resolved


def _seen_or_resolved(finding: Finding, *, still_open: bool, now: datetime) -> int:
    """Refresh a finding this snapshot still bears out, else resolve it; 1 when it was resolved."""
    if still_open:
        finding.last_seen_at = now
        finding.save(update_fields=["last_seen_at"])
        return 0
    finding.resolved_at = now
    finding.save(update_fields=["resolved_at"])
    refresh_host_summary(finding.host_id, now=now)
    return 1


# What to do next about a part of the memory nobody frees, by its cause (memory_explained's gaps).
_NEXT_STEPS = {
    "orphans": "kill the orphans (the host page's orphans finding files one request for all of them)",
    "leader_exited": "kill the process whose main thread exited (a kill request ends every thread)",
    "uninterruptible": "wait for or fix what the D-state process waits on; no signal acts before",
    "other_namespace": "stop the container that holds it",
    "no_process": "request a GPU reset (host page, the GPU's Memory explained) once nothing holds the GPU",
}


def open_memory_not_released(kill_request: KillRequest, outcome: memory.Release,
                             document: dict[str, Any]) -> Finding:
    """The kill's memory that had not come back by the last snapshot compared, as a finding that names
    what holds it and the next step."""
    now = timezone.now()
    rows = process_rows(document)
    explained = memory_explained(document, rows,
                                 threshold_bytes=settings.GPUADMIN_UNATTRIBUTED_THRESHOLD_BYTES)
    index_of = {gpu["uuid"]: gpu["index"] for gpu in document.get("gpus", ())}
    missing = {uuid: figures["expected_bytes"] - figures["released_bytes"]
               for uuid, figures in outcome.per_gpu.items()
               if figures["expected_bytes"] > figures["released_bytes"]}
    holding: list[str] = []
    steps: list[str] = []
    for ident in outcome.still_holding:
        holding.append(f"the kill's target pid {ident.split(':')[0]} is still alive and holds it")
        steps.append("find out why the target outlived the kill (its request's timeline)")
    for uuid in missing:
        gpu_explained = explained.get(uuid)
        for gap in gpu_explained.gaps if gpu_explained else ():
            holding.append(f"GPU {index_of.get(uuid, uuid)}: {gap.seen}")
            steps.append(_NEXT_STEPS.get(gap.cause, gap.remedy))
    if not holding:
        holding.append("no process the snapshot shows: the driver may still be freeing it")
        steps.append("wait for the next snapshots; if it stays, request a GPU reset")
    gpus = ", ".join(f"GPU {index_of.get(uuid, uuid)}" for uuid in missing) or "its GPUs"
    total = sum(missing.values())
    next_steps = list(dict.fromkeys(steps))
    details: dict[str, Any] = {
        "kill_request_id": kill_request.pk,
        "boot_id": memory_baseline_boot(kill_request),
        "not_released_bytes": total,
        "per_gpu": {uuid: {"not_released_bytes": held, "index": index_of.get(uuid)}
                    for uuid, held in missing.items()},
        "snapshots_compared": kill_request.memory_snapshots_compared,
        "held_by": holding,
        "next_steps": next_steps,
    }
    title = (f"{human_bytes(total)} of kill request #{kill_request.pk}'s GPU memory not released on {gpus} "
             f"after {kill_request.memory_snapshots_compared} snapshot(s)")[:300]
    remedy = ("Held by: " + "; ".join(holding) + ". Next: " + "; ".join(next_steps) + ".")
    finding, _created = Finding.objects.update_or_create(
        host=kill_request.host, kind=Finding.Kind.MEMORY_NOT_RELEASED, key=f"kill:{kill_request.pk}",
        resolved_at=None,
        defaults={"severity": Finding.Severity.WARNING, "title": title, "remedy": remedy[:2000],
                  "details": details, "last_seen_at": now},
        create_defaults={"severity": Finding.Severity.WARNING, "title": title, "remedy": remedy[:2000],
                         "details": details, "first_seen_at": now, "last_seen_at": now},
    )
    refresh_host_summary(kill_request.host_id, now=now)
    return finding


def memory_baseline_boot(kill_request: KillRequest) -> str:
    return str(kill_request.memory_baseline.get("boot_id", ""))


def resolve_memory_came_back(host: Host, document: dict[str, Any], *,
                             open_kinds: Collection[str] | None = None, now: datetime | None = None) -> int:
    """Close "memory not released" findings whose memory this snapshot shows back; how many closed.

    ``open_kinds`` as for ``resolve_gone_unkillable``: without one of these open nothing is read."""
    if open_kinds is not None and Finding.Kind.MEMORY_NOT_RELEASED not in open_kinds:
        return 0
    findings = list(Finding.objects.open().filter(host=host, kind=Finding.Kind.MEMORY_NOT_RELEASED))
    if not findings:
        return 0
    now = now or timezone.now()
    requests = KillRequest.objects.in_bulk([f.details.get("kill_request_id") for f in findings])
    boot_id = document.get("host", {}).get("boot_id")
    resolved = 0
    for finding in findings:
        kill_request = requests.get(finding.details.get("kill_request_id"))
        rebooted = finding.details.get("boot_id") not in (None, "", boot_id)
        still_held = (kill_request is not None and not rebooted
                      and not memory.release(kill_request.memory_baseline, document).complete)
        resolved += _seen_or_resolved(finding, still_open=still_held, now=now)
    return resolved
