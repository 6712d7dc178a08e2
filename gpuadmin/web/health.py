"""/healthz: what a process manager or load balancer polls. No login, and nothing but status.

Healthy (200) when the database and the broker answer; 503 when either does
not. The age of the newest snapshot and the supervisor's restart count are
reported but decide nothing: a new install has no snapshot yet, and a worker
that was restarted is working again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Max
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from gpuadmin.data_dir import read_supervisor_state

logger = logging.getLogger(__name__)

OK = "ok"
FAILING = "failing"
BROKER_TIMEOUT_SECONDS = 2.0


def database_answers() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError:
        logger.warning("healthz: the database does not answer", exc_info=True)
        return False
    return True


def broker_answers() -> bool:
    from gpuadmin.celery import app

    try:
        with app.connection_for_write(connect_timeout=BROKER_TIMEOUT_SECONDS) as broker:
            # One attempt and one quick retry: a health check must answer within seconds.
            broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0, interval_max=0)
    except Exception:  # any failure to connect, whatever the transport raises
        logger.warning("healthz: the broker does not answer", exc_info=True)
        return False
    return True


def last_snapshot_at() -> datetime | None:
    from gpuadmin.fleet.models import Host

    return Host.objects.aggregate(newest=Max("last_seen_at"))["newest"]


@dataclass(frozen=True)
class Supervised:
    """What the pages' footer shows of the `make run` supervisor."""

    started_at: datetime
    restarts: int


def supervised() -> Supervised | None:
    state = read_supervisor_state(settings.DATA_DIR)
    if state is None:
        return None
    return Supervised(datetime.fromtimestamp(state.started_at, tz=UTC), state.restarts)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    database_ok = database_answers()
    broker_ok = broker_answers()
    newest = last_snapshot_at() if database_ok else None
    supervisor = read_supervisor_state(settings.DATA_DIR)
    healthy = database_ok and broker_ok
    return JsonResponse({
        "status": OK if healthy else FAILING,
        "web": OK,  # this answer is the web's
        "database": OK if database_ok else FAILING,
        "broker": OK if broker_ok else FAILING,
        "last_snapshot_at": newest.isoformat() if newest else None,
        "last_snapshot_age_seconds": round((timezone.now() - newest).total_seconds(), 1) if newest else None,
        "supervisor_restarts": supervisor.restarts if supervisor else None,
    }, status=200 if healthy else 503)
