"""Celery tasks of the audit app (central side): thin wrappers over services.

Agents load this module too (one Celery app lists every task module), so the
services are imported inside the tasks, where only central runs them.
"""

from __future__ import annotations

import logging

from gpuadmin.celery import CENTRAL_QUEUE, app
from gpuadmin.wire.task_names import ANCHOR_AUDIT

logger = logging.getLogger(__name__)


@app.task(name=ANCHOR_AUDIT, queue=CENTRAL_QUEUE, ignore_result=True)
def anchor() -> int | None:
    """Sign and publish the chain's head when it moved; the anchored sequence, or None."""
    from gpuadmin.audit.anchors import ChainBroken, publish

    try:
        published = publish()
    except ChainBroken as error:
        # Logged as an error every period until someone looks: sealing a broken chain would bless it.
        logger.error("audit chain: %s", error)
        return None
    return published.sequence if published else None
