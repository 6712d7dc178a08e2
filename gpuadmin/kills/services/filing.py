"""Filing a kill request: resolve the exact targets from the host's latest
snapshot, apply the refusal rules, and store the request with its preview.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.audit.models import Action
from gpuadmin.fleet.models import Host, LatestSnapshot
from gpuadmin.fleet.process_tree import ProcessRow
from gpuadmin.kills import memory, plans, targets
from gpuadmin.kills.models import CMDLINE_PREVIEW_ARGS, CMDLINE_PREVIEW_CHARS, KillRequest, KillTarget
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.errors import BadInput, Conflict, NotAllowed, NotFound, Refused
from gpuadmin.kills.states import OPEN
from gpuadmin.text import human_bytes


def get_host(name: str) -> Host:
    try:
        return Host.objects.get(name=name)
    except Host.DoesNotExist:
        raise NotFound(f"no host named {name!r}") from None


def get_request(kill_request_id: int) -> KillRequest:
    """The request with its host and targets, as pages and the API show it; NotFound when there is none."""
    try:
        return KillRequest.objects.shown().get(pk=kill_request_id)
    except KillRequest.DoesNotExist:
        raise NotFound(f"no kill request #{kill_request_id}") from None


def preview(host: Host, pid: int | None, start_time_ticks: int | None, *, include_descendants: bool = False,
            also: Iterable[tuple[int, int]] = (), workload: str = "",
            now: datetime | None = None) -> targets.Preview:
    """What a request would target, from the newest snapshot; refusals and warnings included.

    With ``workload`` (a key such as "slurm_job:4242"), every process of that job, container or
    pod; otherwise the process (pid, start_time_ticks) and those named in ``also``.
    """
    if not host.key_accepted:
        # No order goes to a host whose key no approver accepted: its reports could not be believed.
        return targets.Preview(
            host_name=host.name, snapshot_taken_at=None, boot_id="",
            refusal=f"{host.name} has no accepted key yet: an approver accepts it on the host page "
            "(or with manage.py accept_host) before any order can be sent to it",
        )
    latest = LatestSnapshot.objects.for_host(host)
    if latest is None:
        what = workload or f"PID {pid}"
        return targets.Preview(
            host_name=host.name, snapshot_taken_at=None, boot_id="",
            refusal=f"there is no snapshot from {host.name} yet, so {what} cannot be checked",
        )
    if workload:
        result = targets.resolve_workload(latest.document, workload)
    else:
        assert pid is not None and start_time_ticks is not None
        result = targets.resolve(
            latest.document, pid, start_time_ticks, include_descendants=include_descendants, also=also
        )
    now = now or timezone.now()
    if result.ok and not host.is_online:
        age = (now - host.last_seen_at).total_seconds() if host.last_seen_at else None
        result.warnings.append(
            "the host looks offline" + (f" (last snapshot {int(age)} s ago)" if age is not None else "")
            + ": its agent may not receive the order before it expires"
        )
    return result


def _cmdline_preview(argv: tuple[str, ...], truncated: bool) -> tuple[list[str], bool]:
    shown: list[str] = []
    budget = CMDLINE_PREVIEW_CHARS
    for arg in argv[:CMDLINE_PREVIEW_ARGS]:
        if budget <= 0:
            return shown, True
        shown.append(arg[:budget])
        budget -= len(arg)
    return shown, truncated or len(argv) > CMDLINE_PREVIEW_ARGS or budget < 0


def _target_from_row(kill_request: KillRequest, row: ProcessRow, document: dict[str, Any], *,
                     is_descendant: bool) -> KillTarget:
    digest = next(p["cmdline_sha256"] for p in document["processes"] if p["pid"] == row.pid)
    argv, truncated = _cmdline_preview(row.cmdline, row.cmdline_truncated)
    return KillTarget(
        request=kill_request,
        pid=row.pid,
        start_time_ticks=row.start_time_ticks,
        boot_id=document["host"]["boot_id"],
        ppid=row.ppid,
        uid=row.uid,
        user=row.user or "",
        name=row.name,
        cmdline_sha256=digest,
        cmdline=argv,
        cmdline_truncated=truncated,
        state=row.state,
        gpu_memory_bytes={uuid: used for uuid, used in row.gpu_memory_bytes.items() if used is not None},
        is_descendant=is_descendant,
        owner=row.owner,
    )


def open_request_target(host: Host, rows: Iterable[ProcessRow], boot_id: str) -> KillTarget | None:
    """A target of an open request that is one of ``rows`` (same pid, start and boot), if any."""
    for row in rows:
        existing = (
            KillTarget.objects.filter(
                request__host=host, request__status__in=OPEN, pid=row.pid,
                start_time_ticks=row.start_time_ticks, boot_id=boot_id,
            )
            .select_related("request")
            .first()
        )
        if existing:
            return existing
    return None


def open_requests_by_process(host: Host, boot_id: str) -> dict[tuple[int, int], int]:
    """(pid, start) -> the id of the open request targeting it, for the host page's rows."""
    return {
        (pid, start): request_id
        for pid, start, request_id in KillTarget.objects.filter(
            request__host=host, request__status__in=OPEN, boot_id=boot_id,
        ).values_list("pid", "start_time_ticks", "request_id")
    }


def _check_no_open_request(host: Host, rows: list[ProcessRow], boot_id: str) -> None:
    existing = open_request_target(host, rows, boot_id)
    if existing:
        row = next(r for r in rows if r.pid == existing.pid)
        raise Conflict(
            f"PID {row.pid} ({row.name}) is already a target of request #{existing.request_id}, "
            f"which is {existing.request.get_status_display().lower()}",
            kill_request_id=existing.request_id,
        )


def refused_error(result: targets.Preview) -> Refused:
    extra: dict[str, Any] = {}
    if result.parent_offer:
        extra["parent_offer"] = result.parent_offer.as_dict()
    return Refused(result.refusal or "nothing to signal", **extra)


def file_request(user: Any, *, host: Host | str, pid: Any = None, start_time_ticks: Any = None, reason: str,
                 include_descendants: bool = False, also: Iterable[tuple[int, int]] = (), workload: Any = "",
                 plan: Any = None, now: datetime | None = None) -> KillRequest:
    """File a request for one process (``pid`` + ``start_time_ticks``, its descendants when asked,
    and those named in ``also``), or for every process of ``workload`` (a job/container/pod key)."""
    if not has_role(user, Role.REQUESTER):
        raise NotAllowed("Filing a kill request needs the requester role.")
    reason = (reason or "").strip()
    if not reason:
        raise BadInput("a reason is required: say why this process must be stopped", field="reason")
    workload = workload or ""
    if not isinstance(workload, str):
        raise BadInput(f"workload must be a key such as 'slurm_job:4242'; got {workload!r}", field="workload")
    also = tuple(also)
    if workload and (pid is not None or include_descendants or also):
        raise BadInput("name either a workload or a process (pid, start_time_ticks), not both",
                       field="workload")
    for name, value in () if workload else (("pid", pid), ("start_time_ticks", start_time_ticks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadInput(f"{name} must be a non-negative integer; got {value!r}", field=name)
    try:
        plan = plans.default_plan() if plan is None else plans.validate_plan(plan)
    except plans.PlanError as exc:
        raise BadInput(f"plan: {exc}", field="plan") from None
    if isinstance(host, str):
        host = get_host(host)
    now = now or timezone.now()
    result = preview(host, pid, start_time_ticks, include_descendants=include_descendants, also=also,
                     workload=workload, now=now)
    if not result.ok:
        raise refused_error(result)
    with transaction.atomic():
        return store_request(
            host, user, result, now=now, reason=reason, plan=plan, include_descendants=include_descendants,
            # Who the processes belonged to, as the snapshot said: the job, container or pod.
            details={
                "workload": (
                    {"key": result.workload.key, "label": result.workload.label} if result.workload else None
                ),
                "targets": [{"pid": r.pid, "start_time_ticks": r.start_time_ticks, "owner": r.owner}
                            for r in result.targets],
            },
        )


def store_request(host: Host, user: Any, result: targets.Preview, *, now: datetime, reason: str, plan: Any,
                  include_descendants: bool, details: dict[str, Any],
                  self_service: bool = False) -> KillRequest:
    """Store a previewed request, its targets and its memory baseline, and audit it as requested (with
    ``details`` added); inside the caller's transaction, after the same process was checked to have no
    open request. The one way a kill request comes to be (filed for approval, or self-service)."""
    _check_no_open_request(host, result.targets, result.boot_id)
    document = result.document
    assert document is not None  # a preview with targets was resolved from a snapshot
    kill_request = KillRequest(
        host=host,
        requested_by=user,
        requested_by_name=user.get_username(),
        requested_at=now,
        reason=reason,
        plan=plan,
        include_descendants=include_descendants,
        workload=result.workload.key if result.workload else "",
        workload_label=result.workload.label if result.workload else "",
        snapshot_taken_at=result.snapshot_taken_at or now,
        boot_id=result.boot_id,
        warnings=result.warnings,
        excluded_targets=[e.as_dict() for e in result.excluded],
        pending_expires_at=now + timedelta(seconds=settings.GPUADMIN_PENDING_EXPIRY_SECONDS),
        self_service=self_service,
    )
    rows = result.targets
    base = memory.baseline(document, [(r.pid, r.start_time_ticks) for r in rows])
    kill_request.memory_baseline = base
    kill_request.memory_expected_release_bytes = memory.expected_bytes(base)
    kill_request.save()
    KillTarget.objects.bulk_create(
        [_target_from_row(kill_request, row, document, is_descendant=row.pid in result.descendant_pids)
         for row in rows]
    )
    audit(
        Action.REQUESTED, kill_request, actor=user,
        details={
            "reason": reason,
            "plan": plan,
            "include_descendants": include_descendants,
            **details,
            "excluded": [e.as_dict() for e in result.excluded],
            "warnings": result.warnings,
            "gpu_memory_bytes": kill_request.memory_expected_release_bytes,
            "gpu_memory": human_bytes(kill_request.memory_expected_release_bytes),
        },
    )
    return kill_request


def _gpu_in(document: dict[str, Any], gpu_uuid: str) -> dict[str, Any] | None:
    return next((gpu for gpu in document.get("gpus", ()) if gpu.get("uuid") == gpu_uuid), None)


def _reset_warnings(document: dict[str, Any], gpu: dict[str, Any]) -> list[str]:
    """What the newest snapshot shows on the GPU: the agent refuses the reset while any of it holds it."""
    device = f"/dev/nvidia{gpu['index']}"
    holding = [
        row for row in document.get("processes", ())
        if (row.get("gpu_memory_bytes") or {}).get(gpu["uuid"]) or device in (row.get("device_files") or ())
    ]
    warnings = []
    if holding:
        named = ", ".join(f"pid {row['pid']} ({row.get('name', '?')})" for row in holding[:5])
        more = f" and {len(holding) - 5} more" if len(holding) > 5 else ""
        warnings.append(f"the newest snapshot shows {named}{more} on this GPU or holding {device}: the agent "
                        "refuses the reset while any process holds it, so end them first")
    if gpu.get("mig_instances"):
        warnings.append("this GPU is in MIG mode with instances: the agent refuses a reset of the whole GPU")
    return warnings


def file_reset_request(user: Any, *, host: Host | str, gpu_uuid: Any, reason: str,
                       now: datetime | None = None) -> KillRequest:
    """File a request to reset one GPU of ``host`` (by UUID), approved like a kill by a second admin.

    The agent resets it only if, right then, no process is on it or holds its device file
    (gpuadmin/probe/kill/reset.py); what the newest snapshot shows there is said as a warning.
    """
    if not has_role(user, Role.REQUESTER):
        raise NotAllowed("Filing a GPU reset request needs the requester role.")
    reason = (reason or "").strip()
    if not reason:
        raise BadInput("a reason is required: say why this GPU must be reset", field="reason")
    if not isinstance(gpu_uuid, str) or not gpu_uuid.strip() or len(gpu_uuid) > 128:
        raise BadInput(f"gpu_uuid must be a GPU's UUID such as 'GPU-…'; got {gpu_uuid!r:.140}",
                       field="gpu_uuid")
    if isinstance(host, str):
        host = get_host(host)
    if not host.key_accepted:
        raise Refused(f"{host.name} has no accepted key yet: an approver accepts it on the host page "
                      "before any order can be sent to it")
    latest = LatestSnapshot.objects.for_host(host)
    if latest is None:
        raise Refused(f"there is no snapshot from {host.name} yet, so its GPU {gpu_uuid} cannot be checked")
    document = latest.document
    gpu = _gpu_in(document, gpu_uuid)
    if gpu is None:
        raise Refused(f"the newest snapshot of {host.name} shows no GPU {gpu_uuid}")
    now = now or timezone.now()
    warnings = _reset_warnings(document, gpu)
    if not host.is_online:
        warnings.append("the host looks offline: its agent may not receive the order before it expires")
    with transaction.atomic():
        existing = KillRequest.objects.filter(
            host=host, action=KillRequest.Action.RESET_GPU, gpu_uuid=gpu_uuid, status__in=OPEN
        ).first()
        if existing is not None:
            raise Conflict(
                f"GPU {gpu_uuid} already has an open reset request, #{existing.pk} "
                f"({existing.get_status_display().lower()})", kill_request_id=existing.pk,
            )
        kill_request = KillRequest.objects.create(
            host=host, action=KillRequest.Action.RESET_GPU, gpu_uuid=gpu_uuid, gpu_index=gpu["index"],
            requested_by=user, requested_by_name=user.get_username(), requested_at=now, reason=reason,
            plan=[], snapshot_taken_at=latest.taken_at or now, boot_id=document["host"]["boot_id"],
            warnings=warnings,
            pending_expires_at=now + timedelta(seconds=settings.GPUADMIN_PENDING_EXPIRY_SECONDS),
        )
        audit(
            Action.REQUESTED, kill_request, actor=user,
            details={
                "action": KillRequest.Action.RESET_GPU.value,
                "reason": reason,
                "gpu": {"uuid": gpu_uuid, "index": gpu["index"], "name": gpu.get("name"),
                        "memory_used_bytes": gpu.get("memory_used_bytes")},
                "warnings": warnings,
            },
        )
    return kill_request
