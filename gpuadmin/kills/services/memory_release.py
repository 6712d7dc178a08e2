"""After a kill: the next snapshots of the host confirm how much GPU memory
came back, recorded once per request.

Memory that has not come back after ``GPUADMIN_MEMORY_RELEASE_SNAPSHOTS``
snapshots (or ``SETTLE_SECONDS``) is recorded as not released: the request's
page says so, and a "memory not released" finding on the host names what still
holds it and the next step (``services/findings.py``), until a later snapshot
shows it back (a GPU reset, the orphans killed).

Called for every stored snapshot by ``kills/receivers.py`` (the fleet app's
``snapshot_ingested`` signal, after the snapshot committed).
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
from gpuadmin.fleet.storage.statements import Param, PreparedQuery
from gpuadmin.fleet.taken_at import document_taken_at
from gpuadmin.kills import memory
from gpuadmin.kills.models import KillRequest, KillTarget
from gpuadmin.kills.services._audit import audit
from gpuadmin.kills.services.findings import open_memory_not_released, resolve_memory_came_back
from gpuadmin.kills.states import RELEASING
from gpuadmin.text import human_bytes

# The driver may free a dead process's memory a little later: until this long
# after the kill finished, a snapshot showing less than expected is not final.
SETTLE_SECONDS = 60
# Requests that finished longer ago than this are not waited on any more.
WATCH_FOR = timedelta(hours=6)
# The host's finished requests whose released memory is still to confirm: asked after every snapshot
# of every host, its SQL written once (fleet.storage.statements).
_CANDIDATES = PreparedQuery(
    KillRequest.objects.filter(
        host=Param(KillRequest, "host"), status__in=RELEASING, memory_confirmed_at__isnull=True,
        finished_at__isnull=False, finished_at__lt=Param(KillRequest, "finished_at", key="taken_at"),
        finished_at__gte=Param(KillRequest, "finished_at", key="since"),
    ).order_by("pk").values_list("pk")
)


def confirm_released(host: Host, document: dict[str, Any], *, open_kinds: Collection[str] | None = None,
                     now: datetime | None = None) -> list[int]:
    """Record released memory for the host's finished requests this snapshot settles; their ids.

    ``open_kinds``: the kinds of the host's open findings, when the caller knows them; a "memory not
    released" finding among them closes when this snapshot shows that memory back.
    """
    now = now or timezone.now()
    taken_at = document_taken_at(document)
    if taken_at is None:
        return []
    confirmed: list[int] = []
    for (kill_request_id,) in _CANDIDATES.rows(host=host.pk, taken_at=taken_at, since=now - WATCH_FOR):
        if _confirm_one(kill_request_id, document, taken_at):
            confirmed.append(kill_request_id)
    resolve_memory_came_back(host, document, open_kinds=open_kinds, now=now)
    return confirmed


def _confirm_one(kill_request_id: int, document: dict[str, Any], taken_at: datetime) -> bool:
    with transaction.atomic():
        kill_request = KillRequest.objects.locked(kill_request_id)
        if kill_request.memory_confirmed_at is not None or kill_request.finished_at is None:
            return False
        if not kill_request.targets.filter(outcome__in=KillTarget.GONE).exists():
            return False  # nothing went, so nothing came back to confirm
        base = kill_request.memory_baseline
        if not base.get("targets"):
            return False
        outcome = memory.release(base, document)
        kill_request.memory_snapshots_compared += 1
        settled = (
            (taken_at - kill_request.finished_at).total_seconds() >= SETTLE_SECONDS
            or kill_request.memory_snapshots_compared >= settings.GPUADMIN_MEMORY_RELEASE_SNAPSHOTS
        )
        if not outcome.complete and not settled:
            # The driver may still be freeing it; a later snapshot decides.
            kill_request.save(update_fields=["memory_snapshots_compared"])
            return False
        kill_request.memory_released_bytes = outcome.released_bytes
        kill_request.memory_confirmed_at = taken_at
        kill_request.save(update_fields=["memory_released_bytes", "memory_confirmed_at",
                                         "memory_snapshots_compared"])
        audit(
            Action.MEMORY_RELEASED, kill_request,
            details={
                "expected_bytes": outcome.expected_bytes,
                "released_bytes": outcome.released_bytes,
                "released": human_bytes(outcome.released_bytes),
                "expected": human_bytes(outcome.expected_bytes),
                "per_gpu": outcome.per_gpu,
                "still_holding": outcome.still_holding,
                "snapshot_taken_at": document.get("taken_at"),
                "snapshots_compared": kill_request.memory_snapshots_compared,
                "not_released_bytes": kill_request.memory_not_released_bytes,
            },
        )
        if not outcome.complete:
            open_memory_not_released(kill_request, outcome, document)
    return True
