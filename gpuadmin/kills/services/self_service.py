"""Self-service: a person stops their own processes with no second admin ("My GPUs").

The one deliberate exception to the two-person rule (docs/security.md, "Self-service"). It is
narrow on both sides: here, every target's uid must be one of the person's own accounts on that
host (the caller reads them from ``notify.directory``, the one home of "who is uid 1000 on
gpu07", which sits above this app); on the host, the
order's ``self_service`` block names those uids and the agent signals a target only while
/proc shows one of them (``gpuadmin/probe/kill/identity.py``), so an order central was
tricked into signing still reaches nobody else's process. ``GPUADMIN_SELF_SERVICE`` turns it off.
The request is approved by its filer at once and audited as self-service; everything after the
approval (the signed order, the journal, the ladder, the reports) is a kill's like any other.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.models import Action
from gpuadmin.fleet.models import Host
from gpuadmin.kills import plans
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.dispatch import dispatch_after_commit
from gpuadmin.kills.services.errors import BadInput, NotAllowed, Refused
from gpuadmin.kills.services.filing import get_host, preview, refused_error, store_request
from gpuadmin.kills.states import Status


def self_service_refusal(user: Any) -> str:
    """Why this user may not stop processes themselves now ("" when they may, given their own uids)."""
    if not settings.GPUADMIN_SELF_SERVICE:
        return "self-service is turned off here (GPUADMIN_SELF_SERVICE=0): file a kill request instead"
    if user is None or not user.is_authenticated or not user.is_active:
        return "sign in to stop your processes"
    return ""


def stop_own_processes(
    user: Any,
    *,
    host: Host | str,
    own_uids: Collection[int],
    person_name: str,
    pid: Any,
    start_time_ticks: Any,
    include_descendants: bool = False,
    reason: str = "",
    now: datetime | None = None,
) -> KillRequest:
    """Stop the caller's own process (and its descendants when asked), with no approver.

    ``own_uids``: the uids that are the caller's on ``host``, as the directory says
    (``fairuse.people.own_uids``: the directory sits above this app). Every target must run as one
    of them; one that does not refuses the whole request (nothing is filed). The request is approved
    by its filer at once, and its order carries the targets' uids for the agent to check again
    before every signal.
    """
    if refusal := self_service_refusal(user):
        raise NotAllowed(refusal)
    own = frozenset(own_uids)
    if not own:
        raise NotAllowed(
            f"no account on this host is known to be yours ({person_name}): ask an admin to map "
            "your Unix user in People"
        )
    for name, value in (("pid", pid), ("start_time_ticks", start_time_ticks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadInput(f"{name} must be a non-negative integer; got {value!r}", field=name)
    if isinstance(host, str):
        host = get_host(host)
    now = now or timezone.now()
    result = preview(host, pid, start_time_ticks, include_descendants=include_descendants, now=now)
    if not result.ok:
        raise refused_error(result)
    foreign = [row for row in result.targets if row.uid is None or row.uid not in own]
    if foreign:
        named = ", ".join(f"PID {row.pid} ({row.user or row.uid})" for row in foreign[:5])
        yours = ", ".join(str(uid) for uid in sorted(own))
        raise Refused(
            f"{named}: not yours on {host.name} (your uids there: {yours}), so self-service cannot "
            "stop it; file a kill request, which a second admin approves, or nudge its owner"
        )
    allowed_uids = sorted({row.uid for row in result.targets if row.uid is not None})
    reason = (reason or "").strip() or "stopped by its owner (self-service)"
    plan = plans.default_plan()
    with transaction.atomic():
        kill_request = store_request(
            host, user, result, now=now, reason=reason, plan=plan, include_descendants=include_descendants,
            self_service=True,
            details={
                "self_service": True,
                "person": person_name,
                "targets": [{"pid": r.pid, "start_time_ticks": r.start_time_ticks, "uid": r.uid}
                            for r in result.targets],
            },
        )
        kill_request.transition(Status.APPROVED)
        kill_request.approved_by = user
        kill_request.approved_by_name = user.get_username()
        kill_request.self_approved = True
        kill_request.decided_at = now
        kill_request.start_deadline = now + timedelta(
            seconds=settings.GPUADMIN_APPROVED_START_DEADLINE_SECONDS
        )
        kill_request.save()
        audit(
            Action.APPROVED,
            kill_request,
            actor=user,
            details={
                "self_service": True,
                "self_approved": True,
                "allowed_uids": allowed_uids,
                "start_deadline": kill_request.start_deadline.isoformat(),
            },
        )
        dispatch_after_commit(kill_request.pk)
    return kill_request
