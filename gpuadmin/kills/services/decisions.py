"""What people decide about a request: approve, reject, cancel.

Each decision locks the request row (select_for_update) for its whole
transaction: two approvers clicking at once are serialized, and the second
one finds the request no longer pending and is told so.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuadmin.accounts.credential_changes import approval_refusal
from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.audit.models import Action
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.kills import changes, memory, plans
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.dispatch import dispatch_after_commit
from gpuadmin.kills.services.errors import BadInput, Conflict, NotAllowed, NotFound
from gpuadmin.kills.services.expiry import expire_locked
from gpuadmin.kills.states import Status


def _locked(kill_request_id: int) -> KillRequest:
    try:
        return KillRequest.objects.locked(kill_request_id)
    except KillRequest.DoesNotExist:
        raise NotFound(f"no kill request #{kill_request_id}") from None


def _not_pending(kill_request: KillRequest) -> Conflict:
    status = kill_request.status
    if kill_request.approved_by_name:
        who = kill_request.approved_by_name
        when = kill_request.decided_at
        return Conflict(
            f"request #{kill_request.pk} is already approved (by {who} at {when:%Y-%m-%d %H:%M:%S} UTC); "
            f"it is {kill_request.get_status_display().lower()}",
            status=status,
        )
    return Conflict(
        f"request #{kill_request.pk} is {kill_request.get_status_display().lower()}, not pending",
        status=status,
    )


def _not_cancellable(kill_request: KillRequest) -> Conflict:
    if kill_request.status == Status.APPROVED and kill_request.dispatched_at is not None:
        return Conflict(
            f"request #{kill_request.pk} was already sent to {kill_request.host.name} "
            f"at {kill_request.dispatched_at:%H:%M:%S} UTC; it can no longer be cancelled",
            status=kill_request.status,
        )
    return Conflict(
        f"request #{kill_request.pk} is {kill_request.get_status_display().lower()}; "
        "only pending or approved (not yet sent) requests can be cancelled",
        status=kill_request.status,
    )


def is_own_request(kill_request: KillRequest, user: Any) -> bool:
    return kill_request.requested_by_id is not None and kill_request.requested_by_id == user.pk


def _may_decide_as(kill_request: KillRequest, user: Any) -> bool:
    if not has_role(user, Role.APPROVER):
        return False
    return not is_own_request(kill_request, user) or settings.GPUADMIN_ALLOW_SELF_APPROVAL


def _may_cancel_as(kill_request: KillRequest, user: Any) -> bool:
    if has_role(user, Role.APPROVER):
        return True
    return is_own_request(kill_request, user) and has_role(user, Role.REQUESTER)


def may_decide(kill_request: KillRequest, user: Any) -> bool:
    """Whether this user may approve or reject this request now (for pages: show the buttons)."""
    return kill_request.status == Status.PENDING and _may_decide_as(kill_request, user)


def may_cancel(kill_request: KillRequest, user: Any) -> bool:
    """Whether this user may cancel this request now (for pages: show the button)."""
    return kill_request.is_cancellable and _may_cancel_as(kill_request, user)


def _check_may_decide(kill_request: KillRequest, user: Any, verb: str) -> bool:
    """Raise NotAllowed unless the user may decide; True when it is a self-approval."""
    if not has_role(user, Role.APPROVER):
        raise NotAllowed(f"Only an approver can {verb} a kill request.")
    own = is_own_request(kill_request, user)
    if own and not settings.GPUADMIN_ALLOW_SELF_APPROVAL:
        raise NotAllowed(
            f"You filed request #{kill_request.pk}; a different approver must {verb} it "
            "(a one-admin lab may set GPUADMIN_ALLOW_SELF_APPROVAL=1). You can cancel it instead."
        )
    return own


def approve(kill_request_id: int, user: Any, *, allow_sigkill_only: bool = False,
            now: datetime | None = None) -> KillRequest:
    expired = False
    with transaction.atomic():
        kill_request = _locked(kill_request_id)
        self_approved = _check_may_decide(kill_request, user, "approve")
        now = now or timezone.now()
        # The two-person rule against a superuser who set this approver's password (or gave the role,
        # a TOTP device, a token) and signs in as them: such an account waits a day.
        if refusal := approval_refusal(user, now):
            raise NotAllowed(refusal)
        if kill_request.status == Status.PENDING and expire_locked(kill_request, now):
            expired = True
        else:
            if kill_request.status != Status.PENDING:
                raise _not_pending(kill_request)
            if plans.needs_sigkill_only_approval(kill_request.plan) and not allow_sigkill_only:
                raise BadInput(
                    "this plan starts with SIGKILL (no chance to save a checkpoint); approve it only by "
                    "explicitly allowing \"SIGKILL only\", or reject it",
                    field="allow_sigkill_only",
                )
            latest = LatestSnapshot.objects.for_host(kill_request.host)
            targets = list(kill_request.targets.all())
            compared = changes.compare(targets, latest.document if latest else None)
            if latest is not None:
                base = memory.baseline(
                    latest.document, [(t.pid, t.start_time_ticks) for t in targets]
                )
                kill_request.memory_baseline = base
                kill_request.memory_expected_release_bytes = memory.expected_bytes(base)
            kill_request.transition(Status.APPROVED)
            kill_request.approved_by = user
            kill_request.approved_by_name = user.get_username()
            kill_request.self_approved = self_approved
            kill_request.sigkill_only_allowed = plans.is_sigkill_only(kill_request.plan)
            kill_request.decided_at = now
            kill_request.start_deadline = now + timedelta(
                seconds=settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS
            )
            kill_request.save()
            audit(
                Action.APPROVED, kill_request, actor=user,
                details={
                    "self_approved": self_approved,
                    "sigkill_only_allowed": kill_request.sigkill_only_allowed,
                    "start_deadline": kill_request.start_deadline.isoformat(),
                    "changes_since_request": {
                        str(c.target.pid): c.changes for c in compared if c.changes
                    },
                },
            )
            dispatch_after_commit(kill_request.pk)
    if expired:
        raise Conflict(f"request #{kill_request_id} expired before it was approved", status=Status.EXPIRED)
    return kill_request


def reject(kill_request_id: int, user: Any, reason: str, *, now: datetime | None = None) -> KillRequest:
    reason = (reason or "").strip()
    if not reason:
        raise BadInput("a rejection needs a reason, for the requester and the audit log", field="reason")
    with transaction.atomic():
        kill_request = _locked(kill_request_id)
        _check_may_decide(kill_request, user, "reject")
        if kill_request.status != Status.PENDING:
            raise _not_pending(kill_request)
        kill_request.transition(Status.REJECTED)
        kill_request.closed_by = user
        kill_request.closed_by_name = user.get_username()
        kill_request.decided_at = now or timezone.now()
        kill_request.decision_reason = reason
        kill_request.save()
        audit(Action.REJECTED, kill_request, actor=user, details={"reason": reason})
    return kill_request


def cancel(kill_request_id: int, user: Any, reason: str = "", *, now: datetime | None = None) -> KillRequest:
    with transaction.atomic():
        kill_request = _locked(kill_request_id)
        if not _may_cancel_as(kill_request, user):
            raise NotAllowed("Only the requester or an approver can cancel a kill request.")
        if not kill_request.is_cancellable:
            raise _not_cancellable(kill_request)
        was = kill_request.status
        kill_request.transition(Status.CANCELLED)
        kill_request.closed_by = user
        kill_request.closed_by_name = user.get_username()
        kill_request.decided_at = now or timezone.now()
        kill_request.decision_reason = (reason or "").strip()
        kill_request.save()
        audit(Action.CANCELLED, kill_request, actor=user,
              details={"reason": kill_request.decision_reason, "was": was})
    return kill_request
