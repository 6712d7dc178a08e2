"""The life of a fair-use case (one thing a policy found), written down once.

    watching ──held N minutes──▶ notified ──no answer──▶ reminded ──still no answer──▶ requested
       │                            │  ▲                    │  ▲                          │
       │                            ▼  │ (snooze over)      ▼  │                          │
       │                          snoozed ◀──"still needed"─┘  │                          │
       └──────────── the condition is gone (any state) ──▶ resolved ◀─────────────────────┘

"requested" means a kill request was filed in the policy's name; it still waits for an approver
like any other. Snoozes are bounded by the policy's ``max_snooze_minutes`` (services.snooze).
"""

from __future__ import annotations

from django.db import models


class CaseState(models.TextChoices):
    WATCHING = "watching", "Watching"
    NOTIFIED = "notified", "Owner notified"
    SNOOZED = "snoozed", "Snoozed: still needed"
    REMINDED = "reminded", "Owner notified again"
    REQUESTED = "requested", "Kill requested (waits for approval)"
    RESOLVED = "resolved", "Resolved"


TRANSITIONS: dict[CaseState, frozenset[CaseState]] = {
    CaseState.WATCHING: frozenset({CaseState.NOTIFIED, CaseState.RESOLVED}),
    CaseState.NOTIFIED: frozenset({CaseState.SNOOZED, CaseState.REMINDED, CaseState.RESOLVED}),
    CaseState.SNOOZED: frozenset({CaseState.REMINDED, CaseState.RESOLVED}),
    CaseState.REMINDED: frozenset({CaseState.SNOOZED, CaseState.REQUESTED, CaseState.RESOLVED}),
    CaseState.REQUESTED: frozenset({CaseState.RESOLVED}),
    CaseState.RESOLVED: frozenset(),
}

OPEN = frozenset(state for state, nexts in TRANSITIONS.items() if nexts)
# The owner may answer "still needed" only after a notice.
SNOOZABLE = frozenset({CaseState.NOTIFIED, CaseState.REMINDED})


class InvalidTransition(Exception):
    def __init__(self, current: str, wanted: str) -> None:
        super().__init__(
            f"a case that is {CaseState(current).label.lower()} cannot become "
            f"{CaseState(wanted).label.lower()}"
        )


def check_transition(current: str, wanted: str) -> None:
    if CaseState(wanted) not in TRANSITIONS[CaseState(current)]:
        raise InvalidTransition(current, wanted)


class NudgeState(models.TextChoices):
    OPEN = "open", "Waiting for the holder"
    RELEASED = "released", "Released"
    ESCALATED = "escalated", "Kill requested (waits for approval)"
