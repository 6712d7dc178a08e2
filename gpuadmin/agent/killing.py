"""The agent's kill task: verify an order central signed, execute it on this
host, and report each step to central, signed with this agent's key.

Runs on the host's own queue (``host.<name>``) with the broker as its only
connection: no database access here. The executor (``gpuadmin.probe.kill``)
checks every target right before each signal and keeps a journal keyed by
request id, so a redelivered order is answered from the journal instead of
being executed twice; that is what makes ``acks_late`` safe.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.data_dir import AGENT_JOURNAL
from gpuadmin.keys import agent_signing_key, central_public_key
from gpuadmin.probe.kill.executor import deliver
from gpuadmin.wire.kill_order import OrderRefused, verify_order
from gpuadmin.wire.kill_protocol import order_refused_event
from gpuadmin.wire.signing import MessageKind, seal
from gpuadmin.wire.task_names import EXECUTE_KILL_ORDER, RECORD_KILL_PROGRESS
from gpuadmin.wire.timestamps import wire_time

logger = logging.getLogger(__name__)

# A report that cannot reach the broker is retried briefly, then logged: the
# escalation must go on, and the journal keeps the full record on the host.
REPORT_RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
# Journal entries are kept far longer than any order can live (its start
# deadline is minutes), then pruned so the directory does not grow forever.
JOURNAL_KEEP_SECONDS = 30 * 24 * 3600


def journal_directory() -> Path:
    return Path(settings.DATA_DIR) / AGENT_JOURNAL


def signed_report(event: dict[str, Any]) -> dict[str, Any]:
    """One event, naming this host, signed with this agent's key (central checks both)."""
    return seal({**event, "host": settings.GPUADMIN_HOST_NAME}, MessageKind.KILL_REPORT, agent_signing_key())


def report_to_central(event: dict[str, Any]) -> None:
    app.send_task(RECORD_KILL_PROGRESS, args=[signed_report(event)], queue=CENTRAL_QUEUE, retry=True,
                  retry_policy=REPORT_RETRY_POLICY)


def _refuse(refused: OrderRefused) -> dict[str, Any]:
    """Nothing is signalled; central hears why (signed), and writes it to the audit log."""
    logger.error("refused a message as a kill order (claimed request %s): %s", refused.request_id, refused)
    event = order_refused_event(
        refused.request_id, at=wire_time(time.time()), reason=refused.reason,
        detail=refused.detail[:2000], order_sha256=refused.order_sha256,
    )
    deliver(report_to_central, event)
    return event


def execute(message: Any) -> dict[str, Any] | None:
    """Verify a delivered message as an order (before anything else), then execute it."""
    from gpuadmin.probe.journal import Journal
    from gpuadmin.probe.kill import execute_order

    try:
        order = verify_order(message, central_key=central_public_key(), host_name=settings.GPUADMIN_HOST_NAME,
                             now=time.time())
    except OrderRefused as refused:
        return _refuse(refused)
    journal = Journal(journal_directory())
    try:
        return execute_order(order, journal=journal, report=report_to_central)
    finally:
        try:
            journal.prune(JOURNAL_KEEP_SECONDS)
        except OSError:
            logger.exception("could not prune the kill journal in %s", journal.directory)


@app.task(name=EXECUTE_KILL_ORDER, acks_late=True, ignore_result=True)
def execute_kill_order(message: dict[str, Any]) -> dict[str, Any] | None:
    finished = execute(message)
    if finished:
        logger.info("kill request %s: %s (%s)", finished.get("request_id"), finished.get("result"),
                    finished.get("detail"))
    return finished
