"""Expiring requests that waited too long: pending ones nobody approved, and
approved ones the agent never started before the order's deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services.auditing import audit
from gpuadmin.kills.states import Status

# The agent reports its start as it happens; a report may still be on its way
# (a busy central queue) for a while after the deadline. Expiring only after
# this margin keeps a request that did start from being called expired.
START_REPORT_MARGIN = timedelta(seconds=30)


def pending_is_late(kill_request: KillRequest, now: datetime) -> bool:
    return kill_request.status == Status.PENDING and kill_request.pending_expires_at <= now


def approved_is_late(kill_request: KillRequest, now: datetime) -> bool:
    return (
        kill_request.status == Status.APPROVED
        and kill_request.start_deadline is not None
        and kill_request.start_deadline + START_REPORT_MARGIN <= now
    )


def expire_locked(kill_request: KillRequest, now: datetime) -> bool:
    """Expire a locked request if it is late; the caller holds the row lock and the transaction."""
    if pending_is_late(kill_request, now):
        why = "not approved before it expired"
        deadline = kill_request.pending_expires_at
    elif approved_is_late(kill_request, now):
        assert kill_request.start_deadline is not None
        deadline = kill_request.start_deadline
        if kill_request.dispatched_at is None:
            why = "approved, but the order could not be sent to the host before its start deadline"
        else:
            why = "approved and sent, but the agent did not report a start before the deadline"
    else:
        return False
    kill_request.transition(Status.EXPIRED)
    kill_request.result_detail = why
    kill_request.finished_at = now
    kill_request.save(update_fields=["status", "result_detail", "finished_at"])
    audit("expired", kill_request, details={"why": why, "deadline": deadline.isoformat(),
                                            "dispatched": kill_request.dispatched_at is not None})
    return True
