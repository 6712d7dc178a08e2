"""Signals the fleet app sends to the rest of central.

``snapshot_ingested(sender=Host, host=Host, document=dict)`` is sent once per
accepted snapshot that became the host's latest, after its transaction
committed (so receivers see the stored rows). Snapshots that arrive late or
twice do not send it. The kills app listens to confirm that GPU memory came
back after a kill.
"""

from __future__ import annotations

from django.dispatch import Signal

snapshot_ingested = Signal()
