"""How every JSON API (fleet, kills, audit) writes: ASCII-only JSON. Times are
written by ``gpuadmin.text.utc_text`` (UTC with a "Z")."""

from __future__ import annotations

from rest_framework.renderers import JSONRenderer


class AsciiJSONRenderer(JSONRenderer):
    """JSON with every non-ASCII character as \\uXXXX.

    Process strings are untrusted: a raw U+202E or ANSI escape would reorder
    or recolour a terminal showing ``curl`` output. Escaped, they are inert
    text and decode to exactly what the probe sent.
    """

    ensure_ascii = True

