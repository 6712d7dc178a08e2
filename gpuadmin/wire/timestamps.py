"""Moments as both sides write them on the wire: kill events, orders, GPU health records.

No Django, nothing else of gpuadmin: the probe and central both import it.
"""

from __future__ import annotations

from datetime import UTC, datetime


def wire_time(moment: datetime | float, *, timespec: str = "auto") -> str:
    """A moment as the protocol writes it: ISO 8601 in UTC with a "Z", ``2026-12-02T13:00:00.250000Z``.

    ``moment`` is a timezone-aware datetime or a Unix timestamp (the executor's
    clock). ``timespec`` as ``datetime.isoformat``: "auto" writes fractional
    digits only when the moment has them. Central's display text
    (``gpuadmin.text.utc_text``) is this same form.
    """
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, tz=UTC)
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
