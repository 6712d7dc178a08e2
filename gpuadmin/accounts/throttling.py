"""Which address a failed login counts against (django-axes, settings.AXES_*).

A connection's own address counts, unless it came from a trusted proxy
(``GPUADMIN_TRUSTED_PROXIES``: addresses, networks, and ``unix`` for gunicorn's
Unix socket, which in deploy/ only nginx can open). From a trusted proxy, the
address is the rightmost one in X-Forwarded-For that is not itself a trusted
proxy: nginx's ``$proxy_add_x_forwarded_for`` appends the address it saw, and
anything to its left came from the client and could be made up to dodge the
lockout. Before, any connection's X-Forwarded-For was believed with
GPUADMIN_HTTPS=1: a local user talking to gunicorn's port directly chose a new
address for each guess (issue 30).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

# A Unix-socket peer has no address: gunicorn's REMOTE_ADDR is empty.
UNIX_SOCKET = "unix"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(text: str) -> list[str]:
    """GPUADMIN_TRUSTED_PROXIES, comma-separated; an entry that is neither an address, a network
    nor ``unix`` stops the settings with the reason."""
    entries = [part.strip() for part in text.split(",") if part.strip()]
    for entry in entries:
        if entry == UNIX_SOCKET:
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ImproperlyConfigured(
                f"GPUADMIN_TRUSTED_PROXIES: {entry!r} is not an address, a network (10.0.0.0/8) or "
                f"{UNIX_SOCKET!r}") from None
    return entries


def _is_trusted(address: str, entries: Iterable[str]) -> bool:
    if not address:
        return UNIX_SOCKET in entries
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(entry != UNIX_SOCKET and parsed in ipaddress.ip_network(entry, strict=False)
               for entry in entries)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR", "") or ""
    trusted = settings.GPUADMIN_TRUSTED_PROXIES
    if not _is_trusted(remote, trusted):
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for hop in reversed([part for part in forwarded if part]):
        if not _is_address(hop):
            break  # not what a proxy writes: nothing further left can be believed either
        if not _is_trusted(hop, trusted):
            return hop
    return remote
