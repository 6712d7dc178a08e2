"""The audit page's chain check, without re-hashing the whole log on every load.

Each web process remembers, per database, the newest event its own checks
found sound (sequence and hash). The next page load recomputes only the
events after it, and checks that this event still has that hash. Every
``FULL_VERIFY_EVERY_SECONDS`` (and on a process's first load) the whole chain
is recomputed again.

What the page therefore guarantees: every event newer than the last check is
recomputed now; the events before it were recomputed in full by this process
at most ``FULL_VERIFY_EVERY_SECONDS`` ago, and the log was not cut or
rewritten from the newest of them since. An older event edited in place
(content and stored hash changed, later links left broken) shows on the next
full check, and always in ``manage.py verify_audit``, which recomputes
everything.

The checkpoint lives in this process's memory on purpose: kept in the
database, it could be forged by whoever can write there — the very person
the chain is meant to catch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpuadmin.audit.chain import VerifyResult
from gpuadmin.audit.models import AuditEvent

FULL_VERIFY_EVERY_SECONDS = 600.0


@dataclass(frozen=True)
class Checkpoint:
    sequence: int
    hash: str
    full_verified_at: float  # time.monotonic() of the last full check


@dataclass(frozen=True)
class PageCheck:
    """A chain check for the page, and how much of it was recomputed now."""

    result: VerifyResult
    full: bool  # the whole chain was recomputed on this load
    recomputed_after: int  # events after this sequence were recomputed now (0: all)
    full_verified_seconds_ago: float


_checkpoints: dict[str, Checkpoint] = {}
_lock = threading.Lock()


def verify_for_page(using: str = "default", *, now: float | None = None) -> PageCheck:
    now = time.monotonic() if now is None else now
    with _lock:
        checkpoint = _checkpoints.get(using)
    events = AuditEvent.objects.using(using)
    if checkpoint is None or now - checkpoint.full_verified_at >= FULL_VERIFY_EVERY_SECONDS:
        result = events.verify()
        full_at, after = now, 0
        if result.ok and checkpoint is not None:
            # A tail rewritten with fresh, consistent hashes passes a full check; the
            # event this process saw must still be there as it was.
            result = events.verify_after(checkpoint.sequence, checkpoint.hash)
    else:
        result = events.verify_after(checkpoint.sequence, checkpoint.hash)
        full_at, after = checkpoint.full_verified_at, checkpoint.sequence
    with _lock:
        if result.ok and result.head_sequence is not None and result.head_hash is not None:
            _checkpoints[using] = Checkpoint(result.head_sequence, result.head_hash, full_at)
        # A broken chain keeps the checkpoint it was found against: the page goes on
        # saying so until the log is as it was, or the process is restarted.
    return PageCheck(result=result, full=after == 0, recomputed_after=after,
                     full_verified_seconds_ago=max(0.0, now - full_at))


def forget() -> None:
    """Drop every checkpoint (tests that reset the database; a restored backup)."""
    with _lock:
        _checkpoints.clear()
