"""Shortcuts the kill tests share."""

from __future__ import annotations

from typing import Any

from gpuadmin.kills import services
from gpuadmin.kills.models import KillRequest

REASON = "job finished yesterday, memory still held"


def file(user: Any, pid: int, **kwargs: Any) -> KillRequest:
    kwargs.setdefault("reason", REASON)
    start = kwargs.pop("start", pid * 100)
    return services.file_request(user, host=kwargs.pop("host", "gpu01"), pid=pid, start_time_ticks=start,
                                 **kwargs)


def refreshed(kill_request: KillRequest) -> KillRequest:
    kill_request.refresh_from_db()
    return kill_request


def actions(kill_request: KillRequest | None = None) -> list[str]:
    from gpuadmin.audit.models import AuditEvent

    events = AuditEvent.objects.order_by("sequence")
    if kill_request is not None:
        events = events.filter(kill_request_id=kill_request.pk)
    return list(events.values_list("action", flat=True))
