"""What the notify app does when the kill workflow announces an event, or someone changes another
person's credentials (connected in ``apps.py``).

The kill receiver runs after the event's transaction committed, in whatever process made the change
(a web request, a central worker): it only queues a central task, so an approval never waits
for an email server, and a broker that is down loses the message, never the approval.

The credentials receiver runs inside the change's transaction: it writes the notices there (they
commit or roll back with the change) and queues their delivery after the commit.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from gpuadmin.accounts.models import CredentialChange
from gpuadmin.celery import send_central
from gpuadmin.notify.services import NOTIFYING_ACTIONS, plan_for_credential_change
from gpuadmin.wire.task_names import DELIVER_NOTIFICATION, NOTIFY_KILL_EVENT

logger = logging.getLogger(__name__)


def on_kill_request_event(sender: Any, kill_request_id: int, action: str, **kwargs: Any) -> None:
    if action not in NOTIFYING_ACTIONS:
        return
    try:
        send_central(NOTIFY_KILL_EVENT, kill_request_id, action)
    except Exception:
        logger.exception("notify: could not queue the notifications of kill request #%s (%s)",
                         kill_request_id, action)


def on_credentials_changed(sender: Any, change: CredentialChange, **kwargs: Any) -> None:
    ids = plan_for_credential_change(change)
    transaction.on_commit(lambda: _deliver_each(ids))


def _deliver_each(notification_ids: list[int]) -> None:
    for notification_id in notification_ids:
        try:
            send_central(DELIVER_NOTIFICATION, notification_id)
        except Exception:
            logger.exception("notify: could not queue notification %s", notification_id)
