"""What the read side says about hosts: the JSON API's shapes.

The queries that load them are named on the models' querysets
(``Host.objects.for_listing()``, ``LatestSnapshot.objects.document_for(host)``,
``host.findings.open()``), shared with the pages so both show the same thing.

Plain functions returning dicts rather than DRF serializers: everything here
is read-only, half of it is a stored snapshot document that is already
validated JSON (processes are passed through with every field the probe sent),
and the other half is a few model columns. A function per shape is shorter,
reads top to bottom, and is tested without a request.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from gpuadmin.fleet.models import Finding, Gpu, Host
from gpuadmin.fleet.process_tree import gpu_holders, orphans, process_rows, zombie_trees
from gpuadmin.text import utc_text

Severity = Finding.Severity


def open_finding_counts(host: Host) -> dict[str, int]:
    """Counts by severity, from ``Host.objects.for_listing()`` annotations (queried if missing)."""
    if hasattr(host, f"open_findings_{Severity.CRITICAL.value}"):
        return {s.value: getattr(host, f"open_findings_{s.value}") for s in Severity}
    rows = host.findings.open().values("severity").annotate(n=Count("id"))
    by_severity = {row["severity"]: row["n"] for row in rows}
    return {s.value: by_severity.get(s.value, 0) for s in Severity}


def present_gpus(host: Host) -> list[Gpu]:
    gpus = getattr(host, "present_gpus", None)
    if gpus is None:
        gpus = list(host.gpus.filter(present=True).order_by("index"))
    return gpus


def gpu_dict(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_total_bytes": gpu.memory_total_bytes,
        "memory_used_bytes": gpu.memory_used_bytes,
        "memory_attributed_bytes": gpu.memory_attributed_bytes,
        "memory_unattributed_bytes": gpu.memory_unattributed_bytes,
        "utilization_percent": gpu.utilization_percent,
    }


def host_summary_dict(host: Host) -> dict[str, Any]:
    """One host as the list endpoint shows it: columns only, no snapshot document."""
    by_severity = open_finding_counts(host)
    return {
        "name": host.name,
        "online": host.is_online,
        "first_seen_at": utc_text(host.first_seen_at),
        "last_seen_at": utc_text(host.last_seen_at),
        "last_snapshot_taken_at": utc_text(host.last_snapshot_taken_at),
        "boot_id": host.boot_id,
        "kernel": host.kernel or None,
        "driver_version": host.driver_version or None,
        "pid_max": host.pid_max,
        "pids_in_use": host.pids_in_use,
        "gpus": [gpu_dict(g) for g in present_gpus(host)],
        "counts": {
            "processes": host.process_count,
            "zombies": host.zombie_count,
            "gpu_processes": host.gpu_process_count,
        },
        "open_findings_count": sum(by_severity.values()),
        "open_findings_by_severity": by_severity,
        "gpu_backend": {
            "name": host.gpu_backend_name,
            "available": host.gpu_backend_available,
            "reason": host.gpu_backend_reason or None,
        },
        "last_error": host.last_error or None,
        "last_error_at": utc_text(host.last_error_at),
    }


def finding_dict(finding: Finding) -> dict[str, Any]:
    return {
        "kind": finding.kind,
        "severity": finding.severity,
        "title": finding.title,
        "remedy": finding.remedy,
        "first_seen_at": utc_text(finding.first_seen_at),
        "last_seen_at": utc_text(finding.last_seen_at),
        "details": finding.details,
    }


def processes_that_matter(document: dict[str, Any] | None) -> dict[str, Any]:
    """GPU holders, zombie trees and orphans of a snapshot, each process exactly as the probe sent it."""
    if document is None:
        return {"processes": [], "zombie_trees": [], "orphans": []}
    as_sent = {p["pid"]: p for p in document.get("processes", ())}
    rows = process_rows(document)
    return {
        "processes": [as_sent[r.pid] for r in gpu_holders(rows)],
        "zombie_trees": [
            {
                "parent_pid": tree.parent_pid,
                "parent": as_sent.get(tree.parent_pid),
                "zombie_count": len(tree.zombies),
                "zombies": [as_sent[z.pid] for z in tree.zombies],
            }
            for tree in zombie_trees(rows)
        ],
        "orphans": [as_sent[r.pid] for r in orphans(rows)],
    }


def host_detail_dict(host: Host, document: dict[str, Any] | None, findings: list[Finding]) -> dict[str, Any]:
    return {
        **host_summary_dict(host),
        "snapshot_taken_at": document.get("taken_at") if document else None,
        **processes_that_matter(document),
        "findings": [finding_dict(f) for f in findings],
    }
