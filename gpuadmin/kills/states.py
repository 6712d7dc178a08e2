"""The life of a kill request, written down once.

    pending ──approve──▶ approved ──agent starts──▶ running ──agent finishes──▶ succeeded
       │                    │                                                   failed
       ├─reject──▶ rejected  ├─cancel (not yet dispatched)──▶ cancelled          unkillable
       ├─cancel──▶ cancelled └─start deadline passed──▶ expired                  refused
       └─pending expiry──▶ expired                         ┊                     expired
                                                           └┄┄the agent's late report┄┄▶ running / a result

An agent's "finished" report may reach central before its "started" report
(several central workers take events from one queue), so an approved request
may go straight to a result.

The dotted move corrects an expiry that the agent's late report disproves: it
started in time, its "started" report was lost or held up. It is not in
``TRANSITIONS``, so expired stays final for everything else (no cancel, no
approval, its process free for a new request, nothing for the sweeper). Only an
agent's report may make it, and only for a request whose order was sent; one
that expired pending never had one (``LATE_REPORT_CORRECTIONS``,
``KillRequest.transition(..., by_report=True)``).
"""

from __future__ import annotations

from django.db import models

from gpuadmin.wire.kill_protocol import Result


class Status(models.TextChoices):
    PENDING = "pending", "Pending approval"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"
    EXPIRED = "expired", "Expired"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    UNKILLABLE = "unkillable", "Unkillable"
    REFUSED = "refused", "Refused by the agent"


# The agent's result words (gpuadmin/wire/kill_protocol.py), as statuses. "interrupted": an earlier
# delivery stopped half-way (the agent died); what it did is in the steps before. Every other result is
# the status of that name (a new result without one fails here, at import, not at a report).
RESULT_STATUS: dict[Result, Status] = {
    result: Status.FAILED if result is Result.INTERRUPTED else Status(result.value) for result in Result
}
# What the agent's "finished" event may set.
RESULTS = frozenset(RESULT_STATUS.values())
# What the agent's reports may move an approved request to.
REPORTED = frozenset({Status.RUNNING} | RESULTS)

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.PENDING: frozenset({Status.APPROVED, Status.REJECTED, Status.CANCELLED, Status.EXPIRED}),
    Status.APPROVED: frozenset({Status.CANCELLED} | REPORTED),
    Status.RUNNING: RESULTS,
    Status.REJECTED: frozenset(),
    Status.CANCELLED: frozenset(),
    Status.EXPIRED: frozenset(),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.UNKILLABLE: frozenset(),
    Status.REFUSED: frozenset(),
}

FINAL = frozenset(status for status, nexts in TRANSITIONS.items() if not nexts)
# Not final yet: a process may be the target of one open request at a time.
OPEN = frozenset(TRANSITIONS) - FINAL
# States in which the agent may still be working on the order.
ACTIVE = frozenset({Status.APPROVED, Status.RUNNING})
# Results after which some target may have gone and GPU memory may have come back.
RELEASING = frozenset({Status.SUCCEEDED, Status.UNKILLABLE, Status.FAILED})

# Central expires an approved request whose "started" report has not come by the start
# deadline plus a margin, but the agent may have started in time and the report been lost
# or held up (a broker outage; a backlog on central's queue). The agent's later reports then
# show what happened, and the status follows them as it would have from approved. Kept out
# of TRANSITIONS, so FINAL, OPEN and ACTIVE do not change: nothing else leaves expired.
LATE_REPORT_CORRECTIONS: dict[Status, frozenset[Status]] = {
    Status.EXPIRED: REPORTED - {Status.EXPIRED},
}


class InvalidTransition(Exception):
    def __init__(self, current: str, wanted: str) -> None:
        self.current = Status(current)
        self.wanted = Status(wanted)
        if self.current in FINAL:
            message = f"the request is already {self.current.label.lower()}; that is final"
        else:
            message = (
                f"a request that is {self.current.label.lower()} cannot become {self.wanted.label.lower()}"
            )
        super().__init__(message)


def can_transition(current: str, wanted: str) -> bool:
    return Status(wanted) in TRANSITIONS[Status(current)]


def check_transition(current: str, wanted: str) -> None:
    if not can_transition(current, wanted):
        raise InvalidTransition(current, wanted)


def can_correct_by_late_report(current: str, wanted: str) -> bool:
    """Whether an agent's report may move ``current`` to ``wanted`` (``LATE_REPORT_CORRECTIONS``)."""
    return Status(wanted) in LATE_REPORT_CORRECTIONS.get(Status(current), frozenset())
