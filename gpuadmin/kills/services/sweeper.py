"""The periodic sweep (every few seconds, from Celery beat): expire what
waited too long, re-send orders that never reached the broker, and close
requests whose agent went silent.

When a request is late is the model's rule (``KillRequest.is_late``, and
``KillRequest.objects.late()`` for the same rule as a query; the agent's
``finish_deadline``); the sweeper applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from gpuadmin.audit.models import Action
from gpuadmin.kills import plans
from gpuadmin.kills.models import FINISH_REPORT_MARGIN, KillRequest
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.dispatch import send_order
from gpuadmin.kills.services.expiry import expire_locked
from gpuadmin.kills.states import Status

# The approval's own on-commit send gets this long before the sweeper sends a second copy.
RESEND_AFTER = timedelta(seconds=3)


@dataclass
class SweepResult:
    expired: int = 0
    resent: int = 0
    failed: int = 0


def _fail_silent_run(kill_request_id: int, now: datetime) -> bool:
    with transaction.atomic():
        kill_request = KillRequest.objects.locked(kill_request_id)
        deadline = kill_request.finish_deadline
        if kill_request.status != Status.RUNNING or deadline is None or deadline > now:
            return False
        last = kill_request.steps.order_by("-seq").first()
        seen = f"the last step it reported was #{last.seq} ({last.event})" if last else "it reported no step"
        detail = (
            f"no \"finished\" report from the agent by {deadline:%H:%M:%S} UTC (plan of "
            f"{plans.total_seconds(kill_request.plan)} s + {int(FINISH_REPORT_MARGIN.total_seconds())} s "
            f"margin); {seen}. The agent may have stopped: check the host"
        )
        kill_request.transition(Status.FAILED)
        kill_request.finished_at = now
        kill_request.result_detail = detail
        kill_request.save(update_fields=["status", "finished_at", "result_detail"])
        audit(Action.FINISHED, kill_request,
              details={"result": Status.FAILED.value, "by": "central sweeper", "detail": detail})
    return True


def _expire(kill_request_id: int, now: datetime) -> bool:
    with transaction.atomic():
        return expire_locked(KillRequest.objects.locked(kill_request_id), now)


def sweep(now: datetime | None = None) -> SweepResult:
    now = now or timezone.now()
    result = SweepResult()
    late = KillRequest.objects.late(now).order_by("pk")
    for kill_request_id in list(late.values_list("pk", flat=True)):
        result.expired += _expire(kill_request_id, now)
    unsent = KillRequest.objects.filter(
        status=Status.APPROVED, dispatched_at__isnull=True, start_deadline__gt=now,
        decided_at__lte=now - RESEND_AFTER,
    ).values_list("pk", flat=True)
    for kill_request_id in list(unsent):
        result.resent += send_order(kill_request_id, now=now)
    for kill_request in KillRequest.objects.filter(status=Status.RUNNING).only(
        "pk", "plan", "started_at", "decided_at"
    ):
        deadline = kill_request.finish_deadline
        if deadline is not None and deadline <= now:
            result.failed += _fail_silent_run(kill_request.pk, now)
    return result
