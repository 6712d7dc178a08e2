"""Signals the fleet app sends to the rest of central.

``snapshot_ingested(sender=Host, host=Host, document=dict, open_finding_kinds=frozenset)``
is sent once per accepted snapshot that became the host's latest, after its
transaction committed (so receivers see the stored rows). Snapshots that
arrive late or twice do not send it. ``open_finding_kinds``: the kinds of the
host's findings open as the snapshot's transaction left them, other apps'
included (ingest read them anyway; a finding opened since is seen by the next
snapshot). The kills app listens to confirm that GPU memory came back after a
kill and to close "unkillable" findings whose process is gone.

``snapshot_storing(sender=Host, host=Host, document=dict, rows=dict[int, ProcessRow],
taken_at=datetime)`` is sent inside the transaction that stores a snapshot that became the
host's latest, under the host's row lock, in the host's order: what a receiver writes commits or
fails with the snapshot. The usage ledger (``gpuadmin.usage``, above the fleet) listens.

``snapshot_updates_storing(sender=Host, updates=list[UpdateStoring])`` is the same for snapshot
updates (``fleet.intake.updates``), applied one host at a time or a batch of hosts in one transaction
(one item per host): each host's processes are those of its latest full snapshot, and ``update``
brings the GPUs' figures and the memory of the processes that moved past the history step since it.
The usage ledger follows it too, to charge the time between full snapshots
(``GPUADMIN_FULL_SNAPSHOT_SECONDS``). It is sent inside ``statements.deferred()``: a receiver's
deferrable writes go with the batch's.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from django.dispatch import Signal

if TYPE_CHECKING:
    from gpuadmin.fleet.models import Host
    from gpuadmin.wire.snapshot_update import SnapshotUpdate

snapshot_ingested = Signal()
snapshot_storing = Signal()
snapshot_updates_storing = Signal()


class UpdateStoring(NamedTuple):
    """One host's applied update in ``snapshot_updates_storing``."""

    host: Host
    update: SnapshotUpdate
    taken_at: datetime
