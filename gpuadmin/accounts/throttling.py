"""Which address a failed login counts against (django-axes, settings.AXES_*).

Served directly (``make run``), the address is the connection's. Behind the
reverse proxy (GPUADMIN_HTTPS=1, docs/deploy.md) every connection comes from
the proxy, so the address is the last one the proxy appended to
X-Forwarded-For (nginx's ``$proxy_add_x_forwarded_for``): anything to its
left came from the client and could be made up to dodge the lockout.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR", "")
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None) is None:
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    return next((part for part in reversed(forwarded) if part), remote)
