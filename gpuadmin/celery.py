"""The Celery app, built from Django settings (CELERY_ namespace).

Queues: ``central`` (ingest, kill progress, sweeps; needs the database) and
``host.<name>`` (one per GPU host; its agent probes and signals and needs only
the broker).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuadmin.settings")

CENTRAL_QUEUE = "central"


def host_queue(host_name: str) -> str:
    return f"host.{host_name}"


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
