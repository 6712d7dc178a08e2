"""The "unkillable" finding, opened and closed here only.

A target that outlived the whole plan (usually SIGKILL, stuck in a kernel
call) is a finding on its host from the agent's ``target_survived`` report
until a later snapshot no longer shows that process (same boot, same start
time). The fleet pages list it with the host's other findings.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.utils import timezone

from gpuadmin.fleet.models import Finding, Host
from gpuadmin.fleet.process_tree import process_rows
from gpuadmin.fleet.statements import Param, PreparedQuery
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget

# Asked after every snapshot of every host (resolve_gone_unkillable), almost always in vain: its SQL
# written once (fleet.statements), not built by the ORM each time.
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
        if same_boot and row is not None and row.start_time_ticks == start:
            finding.last_seen_at = now
            finding.save(update_fields=["last_seen_at"])
            continue
        finding.resolved_at = now
        finding.save(update_fields=["resolved_at"])
        resolved += 1
    return resolved
