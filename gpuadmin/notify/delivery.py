"""Sending one message to one destination through Apprise, the one way notifications leave.

Apprise speaks 100+ services from one URL each (``mailto://``, ``slack://``, ``json://``...).
Email addresses of people go through a small Apprise plugin, ``djangomail://<address>``, that
hands the message to Django's email backend: the SMTP settings live in one place (Django's
``EMAIL_*``), and tests read the messages from Django's locmem outbox.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import apprise
from apprise.decorators import notify as apprise_plugin
from django.conf import settings
from django.core.mail import send_mail

EMAIL_SCHEMA = "djangomail"
# Apprise logs why a delivery failed; this much of it is kept on the notification.
ERROR_MAX_CHARS = 2000


def email_url(address: str) -> str:
    local, _, domain = address.rpartition("@")
    return f"{EMAIL_SCHEMA}://{quote(local, safe='')}@{domain}"


# Apprise's decorator carries no types; the function keeps its own.
@apprise_plugin(on=EMAIL_SCHEMA, name="Django email backend")  # type: ignore[untyped-decorator]
def _send_through_django(body: str, title: str, notify_type: str, meta: dict[str, Any],
                         *args: Any, **kwargs: Any) -> bool:
    address = f"{unquote(meta.get('user') or '')}@{meta.get('host') or ''}"
    # An SMTP error raises; Apprise logs it and reports the delivery failed.
    send_mail(title, body, settings.DEFAULT_FROM_EMAIL, [address], fail_silently=False)
    return True


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str = ""


def shown_url(url: str) -> str:
    """The URL with its passwords and tokens masked (Apprise's privacy form), for the timeline."""
    server = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    if server is None:
        return url.split("://", 1)[0] + "://… (not a URL Apprise understands)"
    return str(server.url(privacy=True))[:300]


def send(url: str, subject: str, body: str) -> Outcome:
    """Deliver to one URL; never raises: a failure is an Outcome with Apprise's reason."""
    targets = apprise.Apprise()
    with apprise.LogCapture(level=logging.WARNING) as log:
        if not targets.add(url):
            return Outcome(False, f"not a notification URL Apprise understands: {shown_url(url)}")
        try:
            ok = bool(targets.notify(body=body, title=subject))
        except Exception as exc:  # a plugin bug must not stop the other notifications
            ok = False
            log.write(f"{type(exc).__name__}: {exc}\n")
        reason = log.getvalue().strip()
    if ok:
        return Outcome(True)
    return Outcome(False, (reason or "the service refused the message")[-ERROR_MAX_CHARS:])
