"""Signals the kills app sends, for other apps to react to its workflow without the services calling them.

``kill_request_event`` is sent once for every audit event of a kill request (filed, approved,
rejected, cancelled, expired, dispatched, each step the agent reported, finished, memory
released), *after* the transaction that recorded it commits: a receiver never sees a change
that was rolled back, and nothing it does (or fails to do) can undo or delay the change.
Arguments: ``kill_request_id`` (int) and ``action`` (the audit ``Action`` value, a str).
"""

from __future__ import annotations

from django.dispatch import Signal

kill_request_event = Signal()
