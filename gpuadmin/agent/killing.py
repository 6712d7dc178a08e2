"""The agent's kill task: execute an approved order on this host and report
each step to central as it happens.

Runs on the host's own queue (``host.<name>``) with the broker as its only
connection: no database access here. The executor (``gpuadmin.probe.kill``)
checks every target right before each signal and keeps a journal keyed by
request id, so a redelivered order is answered from the journal instead of
being executed twice; that is what makes ``acks_late`` safe.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.data_dir import AGENT_JOURNAL
from gpuadmin.probe.kill.protocol import Result, finished_event
from gpuadmin.task_names import EXECUTE_KILL_ORDER, RECORD_KILL_PROGRESS

logger = logging.getLogger(__name__)

# A report that cannot reach the broker is retried briefly, then logged: the
# escalation must go on, and the journal keeps the full record on the host.
REPORT_RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
# Journal entries are kept far longer than any order can live (its start
# deadline is minutes), then pruned so the directory does not grow forever.
JOURNAL_KEEP_SECONDS = 30 * 24 * 3600


def journal_directory() -> Path:
    return Path(settings.DATA_DIR) / AGENT_JOURNAL


def report_to_central(event: dict[str, Any]) -> None:
    app.send_task(RECORD_KILL_PROGRESS, args=[event], queue=CENTRAL_QUEUE, retry=True,
                  retry_policy=REPORT_RETRY_POLICY)


def _report_unreadable(order: Any, error: ValueError) -> dict[str, Any] | None:
    """Tell central an order it sent cannot be executed, so the request closes now, not at the sweep."""
    request_id = order.get("request_id") if isinstance(order, dict) else None
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        return None
    event = finished_event(
        str(request_id),
        seq=1,
        at=datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        result=Result.REFUSED,
        detail=f"the agent could not read the order, nothing was done: {error}"[:2000],
    )
    report_to_central(event)
    return event


def execute(order: Any) -> dict[str, Any] | None:
    from gpuadmin.probe.journal import Journal
    from gpuadmin.probe.kill import execute_order

    journal = Journal(journal_directory())
    try:
        return execute_order(order, journal=journal, report=report_to_central)
    except ValueError as error:
        logger.error("refused a malformed kill order: %s", error)
        return _report_unreadable(order, error)
    finally:
        try:
            journal.prune(JOURNAL_KEEP_SECONDS)
        except OSError:
            logger.exception("could not prune the kill journal in %s", journal.directory)


@app.task(name=EXECUTE_KILL_ORDER, acks_late=True, ignore_result=True)
def execute_kill_order(order: dict[str, Any]) -> dict[str, Any] | None:
    finished = execute(order)
    if finished:
        logger.info("kill request %s: %s (%s)", finished.get("request_id"), finished.get("result"),
                    finished.get("detail"))
    return finished
