"""Audit events about one kill request, with the names the log copies filled in.

Private to the services: every change they make is logged by them, inside the
transaction that makes it, so the log and the request never disagree. Once that
transaction commits, ``signals.kill_request_event`` tells other apps (notifications)
what happened: the one place the workflow announces itself.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from gpuadmin.audit import log
from gpuadmin.audit.models import Action
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.signals import kill_request_event


def audit(action: Action, kill_request: KillRequest, *, actor: Any = None,
          details: dict[str, Any] | None = None) -> None:
    log.record(
        action,
        actor=actor,
        kill_request_id=kill_request.pk,
        host_name=kill_request.host.name,
        requester_name=kill_request.requested_by_name,
        approver_name=kill_request.approved_by_name,
        process_users=kill_request.process_users(),
        targets_summary=log.summarize_targets(
            [{"pid": t.pid, "name": t.name, "user": t.user or t.uid} for t in kill_request.targets.all()]
        ),
        details=details or {},
    )
    transaction.on_commit(partial(
        kill_request_event.send_robust, sender=KillRequest, kill_request_id=kill_request.pk,
        action=str(action),
    ))
