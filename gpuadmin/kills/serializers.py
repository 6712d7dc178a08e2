"""The JSON shapes of kill requests (API), as plain functions: the API only
reads models here; every change goes through the services."""

from __future__ import annotations

from typing import Any

from gpuadmin.kills.changes import TargetNow
from gpuadmin.kills.models import KillRequest, KillStep, KillTarget
from gpuadmin.kills.targets import Preview
from gpuadmin.text import utc_text


def target_dict(target: KillTarget) -> dict[str, Any]:
    return {
        "pid": target.pid,
        "start_time_ticks": target.start_time_ticks,
        "boot_id": target.boot_id,
        "ppid": target.ppid,
        "uid": target.uid,
        "user": target.user,
        "name": target.name,
        "cmdline": target.cmdline,
        "cmdline_truncated": target.cmdline_truncated,
        "cmdline_sha256": target.cmdline_sha256,
        "state": target.state,
        "gpu_memory_bytes": target.gpu_memory_bytes,
        "is_descendant": target.is_descendant,
        "owner": target.owner,
        "outcome": target.outcome,
        "outcome_detail": target.outcome_detail,
        "last_signal": target.last_signal or None,
    }


def step_dict(step: KillStep) -> dict[str, Any]:
    return {
        "seq": step.seq,
        "at": utc_text(step.at),
        "received_at": utc_text(step.received_at),
        "event": step.event,
        "pid": step.pid,
        "signal": step.signal or None,
        "method": step.method or None,
        "result": step.result or None,
        "detail": step.detail,
    }


def kill_request_dict(kill_request: KillRequest, *, steps: bool = False,
                      targets_now: list[TargetNow] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": kill_request.pk,
        "status": kill_request.status,
        "final": kill_request.is_final,
        "host": kill_request.host.name,
        "requested_by": kill_request.requested_by_name,
        "requested_at": utc_text(kill_request.requested_at),
        "reason": kill_request.reason,
        "plan": kill_request.plan,
        "include_descendants": kill_request.include_descendants,
        "workload": (
            {"key": kill_request.workload, "label": kill_request.workload_label}
            if kill_request.workload else None
        ),
        "snapshot_taken_at": utc_text(kill_request.snapshot_taken_at),
        "boot_id": kill_request.boot_id,
        "warnings": kill_request.warnings,
        "excluded_targets": kill_request.excluded_targets,
        "pending_expires_at": utc_text(kill_request.pending_expires_at),
        "approved_by": kill_request.approved_by_name or None,
        "self_approved": kill_request.self_approved,
        "sigkill_only_allowed": kill_request.sigkill_only_allowed,
        "closed_by": kill_request.closed_by_name or None,
        "decided_at": utc_text(kill_request.decided_at),
        "decision_reason": kill_request.decision_reason,
        "start_deadline": utc_text(kill_request.start_deadline),
        "dispatched_at": utc_text(kill_request.dispatched_at),
        "started_at": utc_text(kill_request.started_at),
        "finished_at": utc_text(kill_request.finished_at),
        "result_detail": kill_request.result_detail,
        "memory": {
            "expected_release_bytes": kill_request.memory_expected_release_bytes,
            "released_bytes": kill_request.memory_released_bytes,
            "confirmed_at": utc_text(kill_request.memory_confirmed_at),
        },
        "targets": [target_dict(t) for t in kill_request.targets.all()],
    }
    if steps:
        data["steps"] = [step_dict(s) for s in kill_request.steps.all()]
    if targets_now is not None:
        data["targets_now"] = [
            {
                "pid": now.target.pid,
                "gone": now.gone,
                "will_be_refused": now.will_be_refused,
                "gpu_memory_now_bytes": now.gpu_memory_now_bytes,
                "changes": now.changes,
            }
            for now in targets_now
        ]
    return data


def preview_dict(preview: Preview) -> dict[str, Any]:
    return {
        "host": preview.host_name,
        "snapshot_taken_at": utc_text(preview.snapshot_taken_at),
        "boot_id": preview.boot_id,
        "ok": preview.ok,
        "refusal": preview.refusal,
        "parent_offer": preview.parent_offer.as_dict() if preview.parent_offer else None,
        "warnings": preview.warnings,
        "workload": (
            {"key": preview.workload.key, "label": preview.workload.label} if preview.workload else None
        ),
        "targets": [
            {
                "pid": row.pid,
                "start_time_ticks": row.start_time_ticks,
                "ppid": row.ppid,
                "uid": row.uid,
                "user": row.user,
                "name": row.name,
                "state": row.state,
                "cmdline": list(row.cmdline),
                "gpu_memory_bytes": row.gpu_memory_bytes,
                "owner": row.owner,
                "is_descendant": i > 0 and preview.workload is None,
            }
            for i, row in enumerate(preview.targets)
        ],
        "excluded": [e.as_dict() for e in preview.excluded],
    }
