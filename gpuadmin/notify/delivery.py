"""Sending one message to one destination through Apprise, the one way notifications leave.

Apprise speaks 100+ services from one URL each (``mailto://``, ``slack://``, ``json://``...).
Email addresses of people go through a small Apprise plugin, ``djangomail://<address>``, that
hands the message to Django's email backend: the SMTP settings live in one place (Django's
``EMAIL_*``), and tests read the messages from Django's locmem outbox.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import quote, unquote

from django.conf import settings
from django.core.mail import send_mail

EMAIL_SCHEMA = "djangomail"
# Apprise logs why a delivery failed; this much of it goes to the log.
ERROR_MAX_CHARS = 2000
logger = logging.getLogger(__name__)

# The URLs a person may give (docs/security.md, "Notification URLs"). Central sends from inside the
# lab's network, so a URL is a request central makes on the person's behalf: a requester's
# json://127.0.0.1:9911/internal/admin had central call a local admin port and show the answer.
# Schemes whose URL names the server the message goes to: its host is resolved, and every address
# it resolves to must be public, when the URL is saved and again before each send (DNS may change).
ADDRESSED_SCHEMES = frozenset({
    "json", "jsons", "xml", "xmls", "form", "forms",  # webhooks
    "mmost", "mmosts", "rocket", "rockets", "matrix", "matrixs", "gotify", "gotifys", "apprise", "apprises",
})
# Schemes of public services that send to the service's own servers, whatever the URL holds (tokens).
SERVICE_SCHEMES = frozenset({"slack", "discord", "msteams", "tgram", "pover"})
# Every other Apprise scheme is refused: some reach this box's own files or processes (windows://,
# macosx://, dbus://, glib://, kde://, syslog://, a local file of attachments...), some take a
# server from a parameter (mailto://...?smtp=127.0.0.1). People's email goes through EMAIL_SCHEMA.
ALLOWED_SCHEMES = ADDRESSED_SCHEMES | SERVICE_SCHEMES
# What a person sees when a delivery failed: never the remote server's answer (its status or body
# could be a local service's), which goes to the log for the admin.
DELIVERY_FAILED = "delivery failed (the server log says why)"


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].strip().lower() if "://" in url else ""


def _non_public(address: str) -> str:
    """What kind of non-public address this is, or "" for a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is link-local anyway
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind, flagged in (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                          ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast),
                          ("reserved", ip.is_reserved), ("private", ip.is_private)):
        if flagged:
            return kind
    return "" if ip.is_global else "non-public"


def destination_problem(url: str) -> str:
    """Why central must not send to this URL (for the person who gave it), or "" when it may.

    GPUADMIN_NOTIFY_ALLOW_PRIVATE=1 (an admin's choice: the lab's own Mattermost on 10.x) allows
    addresses that are not public, loopback included; the schemes stay as they are.
    """
    scheme = _scheme(url)
    # EMAIL_SCHEMA: Django's email backend, whose SMTP server is the admin's setting, not the URL's.
    if scheme == EMAIL_SCHEMA or scheme in SERVICE_SCHEMES:
        return ""
    if scheme not in ADDRESSED_SCHEMES:
        return (f"{scheme or 'this'}:// is not a scheme gpuadmin sends to; use one of "
                f"{', '.join(sorted(ALLOWED_SCHEMES))}")
    return _address_problem(url)


def _address_problem(url: str) -> str:
    server = _apprise().Apprise.instantiate(url, suppress_exceptions=True)
    if server is None:
        return "not a notification URL Apprise understands"
    host = str(getattr(server, "host", "") or "").strip("[]")
    if not host:
        return "the URL names no server"
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return f"{host} cannot be resolved"
    if settings.GPUADMIN_NOTIFY_ALLOW_PRIVATE:
        return ""
    refused = [f"{host} is {address}, a {kind} address: notifications go to public servers only"
               for address in sorted(addresses) if (kind := _non_public(address))]
    return refused[0] if refused else ""


def email_url(address: str) -> str:
    local, _, domain = address.rpartition("@")
    return f"{EMAIL_SCHEMA}://{quote(local, safe='')}@{domain}"


def _send_through_django(body: str, title: str, notify_type: str, meta: dict[str, Any],
                         *args: Any, **kwargs: Any) -> bool:
    address = f"{unquote(meta.get('user') or '')}@{meta.get('host') or ''}"
    # An SMTP error raises; Apprise logs it and reports the delivery failed.
    send_mail(title, body, settings.DEFAULT_FROM_EMAIL, [address], fail_silently=False)
    return True


@functools.cache
def _apprise() -> ModuleType:
    """Apprise, with EMAIL_SCHEMA registered: imported on first use, not by every process that loads
    the apps (a worker, a page server, a management command), most of which never send anything."""
    import apprise
    from apprise.decorators import notify as apprise_plugin

    apprise_plugin(on=EMAIL_SCHEMA, name="Django email backend")(_send_through_django)
    return apprise


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str = ""


def shown_url(url: str) -> str:
    """The URL with its passwords and tokens masked (Apprise's privacy form), for the timeline."""
    server = _apprise().Apprise.instantiate(url, suppress_exceptions=True)
    if server is None:
        return url.split("://", 1)[0] + "://… (not a URL Apprise understands)"
    return str(server.url(privacy=True))[:300]


def send(url: str, subject: str, body: str) -> Outcome:
    """Deliver to one URL; never raises: a failure is an Outcome whose error a person may see.

    The destination is checked again here (a name may resolve elsewhere since it was saved), and
    redirects are not followed (a public server could send central on to a local one). Why the
    service refused goes to the log only.
    """
    if problem := destination_problem(url):
        logger.warning("notification to %s refused: %s", shown_url(url), problem)
        return Outcome(False, f"refused: {problem}")
    apprise = _apprise()
    targets = apprise.Apprise(asset=apprise.AppriseAsset(http_redirects=False))
    with apprise.LogCapture(level=logging.WARNING) as log:
        server = apprise.Apprise.instantiate(url, asset=targets.asset, suppress_exceptions=True)
        if server is None:
            return Outcome(False, f"not a notification URL Apprise understands: {shown_url(url)}")
        server.redirects = False  # whatever the URL says (?redirect=yes)
        targets.add(server)
        try:
            ok = bool(targets.notify(body=body, title=subject))
        except Exception as exc:  # a plugin bug must not stop the other notifications
            ok = False
            log.write(f"{type(exc).__name__}: {exc}\n")
        reason = log.getvalue().strip()
    if ok:
        return Outcome(True)
    logger.warning("notification to %s failed: %s", shown_url(url),
                   (reason or "the service refused the message")[-ERROR_MAX_CHARS:])
    return Outcome(False, DELIVERY_FAILED)
