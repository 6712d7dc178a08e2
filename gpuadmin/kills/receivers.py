"""What the kills app does when other apps send signals; connected in ``apps.py``.

A receiver only calls services: the rules stay in ``services/``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from gpuadmin.fleet.models import Host
from gpuadmin.kills.services import confirm_released, resolve_gone_unkillable

logger = logging.getLogger(__name__)


def on_snapshot_ingested(sender: Any, host: Host, document: dict[str, Any],
                         open_finding_kinds: Collection[str] | None = None, **kwargs: Any) -> None:
    """A new snapshot of ``host`` committed: close what it shows gone, confirm memory that came back."""
    try:
        resolve_gone_unkillable(host, document, open_kinds=open_finding_kinds)
        confirm_released(host, document, open_kinds=open_finding_kinds)
    except Exception:
        # A receiver error must not look like a failed ingest: the snapshot is stored.
        logger.exception("kills: could not check released memory after a snapshot of %s", host)
