"""The audit log grouped by kill request: one story per request, read from its events alone.

A story's facts (outcome, reason, requester, approver, how long it took,
memory freed) come from the events, never from the kill request's row: the
log must read the same after requests, users and hosts are gone.

Filters choose which requests appear (a request appears when any of its
events matches); each story then shows all of the request's events, since a
story cut by a filter would not be one. Events about no request (none today;
later security events) are one story of their own, the newest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Max, QuerySet

from gpuadmin.audit.models import Action, AuditEvent
from gpuadmin.audit.sentences import described
from gpuadmin.kills.states import RESULT_STATUS, Status
from gpuadmin.wire.kill_protocol import Result

# Events shown for the story of events about no request (its full list is the flat view).
UNGROUPED_EVENTS_SHOWN = 50

# The action that closes a request, and the status it leaves it in.
_CLOSING = {Action.REJECTED: Status.REJECTED, Action.CANCELLED: Status.CANCELLED,
            Action.EXPIRED: Status.EXPIRED}


@dataclass
class RequestStory:
    kill_request_id: int | None
    # Oldest first: a story reads forward.
    events: list[AuditEvent] = field(default_factory=list)

    @property
    def first(self) -> AuditEvent:
        return self.events[0]

    @property
    def host_name(self) -> str:
        return next((e.host_name for e in self.events if e.host_name), "")

    @property
    def requester_name(self) -> str:
        return next((e.requester_name for e in reversed(self.events) if e.requester_name), "")

    @property
    def approver_name(self) -> str:
        return next((e.approver_name for e in reversed(self.events) if e.approver_name), "")

    @property
    def targets_summary(self) -> str:
        return next((e.targets_summary for e in reversed(self.events) if e.targets_summary), "")

    def _details_of(self, action: str) -> dict[str, Any] | None:
        event = self._last(action)
        return event.details if event is not None and isinstance(event.details, dict) else None

    def _last(self, action: str) -> AuditEvent | None:
        return next((e for e in reversed(self.events) if e.action == action), None)

    @property
    def reason(self) -> str:
        reason = (self._details_of(Action.REQUESTED) or {}).get("reason")
        return reason if isinstance(reason, str) else ""

    @property
    def outcome(self) -> Status | None:
        """The request's status as its events tell it; None for a story of no request."""
        if self.kill_request_id is None:
            return None
        for event in reversed(self.events):
            if event.action in _CLOSING:
                return _CLOSING[event.action]
            if event.action == Action.FINISHED:
                return _finished_status(event)
        if self._last(Action.STARTED):
            return Status.RUNNING
        if self._last(Action.APPROVED):
            return Status.APPROVED
        return Status.PENDING

    @property
    def requested_at(self) -> datetime | None:
        event = self._last(Action.REQUESTED)
        return event.created_at if event else None

    @property
    def ended_at(self) -> datetime | None:
        """When central recorded the request's end (its closing or "finished" event)."""
        for event in reversed(self.events):
            if event.action in _CLOSING or event.action == Action.FINISHED:
                return event.created_at
        return None

    @property
    def duration_seconds(self) -> float | None:
        """From the request to its end, as central saw it; None while it is open."""
        if self.requested_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.requested_at).total_seconds()

    @property
    def run_seconds(self) -> float | None:
        """How long the host ran the order, by the host's own clock (its "started" and "finished")."""
        started, finished = self._details_of(Action.STARTED), self._details_of(Action.FINISHED)
        try:
            begin = datetime.fromisoformat(started["at"])  # type: ignore[index]
            end = datetime.fromisoformat(finished["at"])  # type: ignore[index]
        except (TypeError, KeyError, ValueError):
            return None
        return max(0.0, (end - begin).total_seconds())

    @property
    def memory_expected_bytes(self) -> int | None:
        details = self._details_of(Action.REQUESTED) or {}
        value = details.get("gpu_memory_bytes")
        return value if isinstance(value, int) else None

    @property
    def memory_freed_bytes(self) -> int | None:
        details = self._details_of(Action.MEMORY_RELEASED) or {}
        value = details.get("released_bytes")
        return value if isinstance(value, int) else None


def _finished_status(event: AuditEvent) -> Status:
    result = event.details.get("result") if isinstance(event.details, dict) else None
    try:
        return RESULT_STATUS[Result(result if isinstance(result, str) else "")]
    except ValueError:  # the sweeper writes a status ("failed"); anything else is a failure
        return Status(result) if result in Status.values else Status.FAILED


def request_groups(events: QuerySet[AuditEvent]) -> QuerySet:
    """One row per kill request among ``events`` ({"kill_request_id", "newest"}), newest activity first."""
    # order_by() first: the events' own ordering would otherwise join the GROUP BY.
    return (
        events.order_by().values("kill_request_id").annotate(newest=Max("sequence")).order_by("-newest")
    )


def stories_for(groups: Sequence[dict[str, Any]], events: QuerySet[AuditEvent]) -> list[RequestStory]:
    """The stories of one page of ``request_groups``: every event of each request, with sentences."""
    ids = [g["kill_request_id"] for g in groups if g["kill_request_id"] is not None]
    by_id: dict[int | None, RequestStory] = {g["kill_request_id"]: RequestStory(g["kill_request_id"])
                                            for g in groups}
    loaded = list(AuditEvent.objects.filter(kill_request_id__in=ids).order_by("sequence")) if ids else []
    if None in by_id:
        ungrouped = events.filter(kill_request_id__isnull=True).order_by("-sequence")
        loaded += reversed(ungrouped[:UNGROUPED_EVENTS_SHOWN])
    for event in described(loaded):
        by_id[event.kill_request_id].events.append(event)
    return [by_id[g["kill_request_id"]] for g in groups if by_id[g["kill_request_id"]].events]
