"""The Celery app, built from Django settings (CELERY_ namespace).

Queues: ``central`` (ingest, kill progress, sweeps; needs the database) and
``host.<name>`` (one per GPU host; its agent probes and signals and needs only
the broker).
"""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

CENTRAL_QUEUE = "central"
KILL_SWEEP_PERIOD_SECONDS = 5.0
# A periodic task that waits longer than this share of its period is dropped:
# the next one is already on its way, so late runs never pile up behind an
# offline worker.
EXPIRES_SHARE_OF_PERIOD = 0.8


def host_queue(host_name: str) -> str:
    return f"host.{host_name}"


def beat_schedule(probe_interval_seconds: float) -> dict[str, dict]:
    """Central's periodic tasks; each expires before its next run is due."""
    return {
        "schedule-probes": {
            "task": "gpuadmin.fleet.schedule_probes",
            "schedule": float(probe_interval_seconds),
            "options": {"expires": probe_interval_seconds * EXPIRES_SHARE_OF_PERIOD},
        },
        "sweep-kills": {
            "task": "gpuadmin.kills.sweep",
            "schedule": KILL_SWEEP_PERIOD_SECONDS,
            "options": {"expires": KILL_SWEEP_PERIOD_SECONDS * EXPIRES_SHARE_OF_PERIOD},
        },
    }


# Central tasks go to `central` without every caller naming it; agent tasks
# have no default route on purpose: they are always sent to one host's queue.
TASK_ROUTES = {
    "gpuadmin.fleet.*": {"queue": CENTRAL_QUEUE},
    "gpuadmin.kills.*": {"queue": CENTRAL_QUEUE},
}

app = Celery(
    "gpuadmin",
    include=[
        "gpuadmin.agent.probing",  # host side: probe_host
        "gpuadmin.agent.killing",  # host side: execute_kill_order
        "gpuadmin.fleet.tasks",  # central: ingest_snapshot, schedule_probes
        "gpuadmin.kills.tasks",  # central: record_kill_progress, sweep
    ],
)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_routes = TASK_ROUTES
app.conf.beat_schedule = beat_schedule(settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
