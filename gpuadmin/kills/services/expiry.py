"""Expiring requests that waited too long: pending ones nobody approved, and
approved ones the agent never started before the order's deadline.
"""

from __future__ import annotations

from datetime import datetime

from gpuadmin.audit.models import Action
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.states import Status


def expire_locked(kill_request: KillRequest, now: datetime) -> bool:
    """Expire a locked request if it is late (``KillRequest.is_late``); the caller holds the row lock."""
    if not kill_request.is_late(now):
        return False
    if kill_request.status == Status.PENDING:
        why = "not approved before it expired"
        deadline = kill_request.pending_expires_at
    else:
        assert kill_request.start_deadline is not None
        deadline = kill_request.start_deadline
        if kill_request.dispatched_at is None:
            why = "approved, but the order could not be sent to the host before its start deadline"
        else:
            why = "approved and sent, but the agent did not report a start before the deadline"
    kill_request.transition(Status.EXPIRED)
    kill_request.result_detail = why
    kill_request.finished_at = now
    kill_request.save(update_fields=["status", "result_detail", "finished_at"])
    audit(Action.EXPIRED, kill_request, details={"why": why, "deadline": deadline.isoformat(),
                                            "dispatched": kill_request.dispatched_at is not None})
    return True
