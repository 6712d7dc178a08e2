"""What the notify app does when the kill workflow announces an event (connected in ``apps.py``).

The receiver runs after the event's transaction committed, in whatever process made the change
(a web request, a central worker): it only queues a central task, so an approval never waits
for an email server, and a broker that is down loses the message, never the approval.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuadmin.celery import send_central
from gpuadmin.notify.services import NOTIFYING_ACTIONS
from gpuadmin.task_names import NOTIFY_KILL_EVENT

logger = logging.getLogger(__name__)


def on_kill_request_event(sender: Any, kill_request_id: int, action: str, **kwargs: Any) -> None:
    if action not in NOTIFYING_ACTIONS:
        return
    try:
        send_central(NOTIFY_KILL_EVENT, kill_request_id, action)
    except Exception:
        logger.exception("notify: could not queue the notifications of kill request #%s (%s)",
                         kill_request_id, action)
