"""How the pages speak htmx, in one place (as NetBox's utilities/htmx.py).

Every page region is one partial template that the full page includes and
that is returned alone to htmx, so a view only decides *which* of the two to
render: ``wants_fragment``. Responses vary on the headers that decide it
(``vary_on_htmx``), a poll is stopped with ``HTMX_STOP_POLLING``, and polls
come every ``poll_seconds()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

# htmx stops polling an element when its request is answered with this status.
HTMX_STOP_POLLING = 286



def poll_seconds() -> int:
    """How often the live regions (host tables, fleet, the kill list) ask again: a probe interval,
    since nothing they show changes faster than the snapshots arrive."""
    return max(1, int(settings.GPUADMIN_PROBE_INTERVAL_SECONDS))

# htmx swaps nothing when a request is answered with this status (a poll with nothing new).
HTTP_NO_CONTENT = 204

# The request headers that decide page or fragment.
PAGE_OR_FRAGMENT_HEADERS = ("HX-Request", "HX-History-Restore-Request")


class HtmxHttpRequest(HttpRequest):
    """The type of a request that went through django_htmx's HtmxMiddleware (in
    settings.MIDDLEWARE for every request): views that read ``request.htmx`` take this."""

    htmx: HtmxDetails


def wants_fragment(request: HtmxHttpRequest) -> bool:
    """True when htmx will swap the answer into part of a page.

    False for a browser's page load, and for htmx's history restore: going
    back to a URL htmx pushed (a filter, a page of a table) that is not in its
    history cache, htmx asks for that URL with ``HX-Request`` *and*
    ``HX-History-Restore-Request`` and puts the answer in place of the whole
    body, so it must get the whole page.
    """
    return bool(request.htmx) and not request.htmx.history_restore_request


def fragment_target(request: HtmxHttpRequest) -> str | None:
    """The id of the element a fragment request targets (``HX-Target``); None for a page."""
    return request.htmx.target if wants_fragment(request) else None


def vary_on_htmx(*extra_headers: str) -> Callable[[Any], Any]:
    """``vary_on_headers`` for a view that answers a page or a fragment; ``extra_headers`` are
    any others it reads (``HX-Target``)."""
    return vary_on_headers(*PAGE_OR_FRAGMENT_HEADERS, *extra_headers)
