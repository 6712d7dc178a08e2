"""How every JSON API (fleet, kills, audit) writes: ASCII-only JSON, and times
as UTC with a "Z"."""

from __future__ import annotations

from datetime import datetime

from rest_framework.renderers import JSONRenderer


class AsciiJSONRenderer(JSONRenderer):
    """JSON with every non-ASCII character as \\uXXXX.

    Process strings are untrusted: a raw U+202E or ANSI escape would reorder
    or recolour a terminal showing ``curl`` output. Escaped, they are inert
    text and decode to exactly what the probe sent.
    """

    ensure_ascii = True


def utc_text(moment: datetime | None) -> str | None:
    """ISO 8601 with "Z" for UTC; fractional digits only when the time has them.

    The audit log keeps its own (``gpuadmin.audit.export.time_text``): it always
    writes six fractional digits, the form its hash chain covers.
    """
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")
