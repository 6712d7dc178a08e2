"""Approving needs a recent authentication: GitHub's "sudo mode".

A login, or the password typed again on the re-authentication page
(``accounts.views.reauthenticate``), is remembered in the session with its
time. Approving a kill request needs one no older than
GPUADMIN_REAUTH_MAX_AGE_SECONDS (15 minutes); an older session is sent to
the re-authentication page, which returns to the request. A stolen session
cookie, or a browser left logged in, therefore approves nothing without the
password.

With GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL=1 a login is not enough: only a
re-authentication that also checked a code from the approver's TOTP device
(django-otp; ``manage.py totp_device``) counts.

API approvals authenticated by a session follow the same rule (403 with
``reauth_url``). Approvals with an API token do not: the token is itself a
secret made on the server by someone with shell access, stored hashed and
expiring; with TOTP required, they must carry a current code (``totp``).

An approval sent to re-authenticate is not dropped: the approve POST (CSRF-checked) leaves an
*intent* in the session (its kind, its data, the words that name it, a random token, its time) and
the re-authentication page names it; the password POST that carries the same token (CSRF-checked
too) finishes it through the handler its app registered (``register_intent``), once, within
INTENT_MAX_AGE_SECONDS. A GET never finishes anything, and ``next`` stays only where to go after.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.signals import user_logged_in
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode
from django_htmx.http import HttpResponseClientRedirect

SESSION_KEY = "gpuadmin_authenticated"
INTENT_SESSION_KEY = "gpuadmin_reauth_intent"
# An intent older than this is forgotten: the password must not finish something left behind.
INTENT_MAX_AGE_SECONDS = 10 * 60

# kind -> finish(request, data): what an intent does once the password is right (an HttpResponse).
IntentFinisher = Callable[[HttpRequest, dict[str, Any]], HttpResponse]
_finishers: dict[str, IntentFinisher] = {}


def totp_required() -> bool:
    return bool(settings.GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL)


def mark_authenticated(request: HttpRequest, *, with_totp: bool, at: float | None = None) -> None:
    """``at``: when the person proved who they are, if not now (an OpenID Connect provider's auth_time)."""
    request.session[SESSION_KEY] = {"at": time.time() if at is None else at, "totp": with_totp}


def seconds_since_authentication(request: HttpRequest) -> float | None:
    """Seconds since the last login or re-authentication that counts for approving; None if none does."""
    mark = request.session.get(SESSION_KEY) if hasattr(request, "session") else None
    if not isinstance(mark, dict) or not isinstance(mark.get("at"), int | float):
        return None
    if totp_required() and not mark.get("totp"):
        return None
    return max(0.0, time.time() - mark["at"])


def recently_authenticated(request: HttpRequest) -> bool:
    age = seconds_since_authentication(request)
    return age is not None and age <= settings.GPUADMIN_REAUTH_MAX_AGE_SECONDS


def reauth_url(next_url: str) -> str:
    return f"{reverse('reauthenticate')}?{urlencode({'next': next_url})}"


def register_intent(kind: str, finish: IntentFinisher) -> None:
    """Let ``kind`` of intent be finished by ``finish`` after re-authentication (an app's ready())."""
    _finishers[kind] = finish


def remember_intent(request: HttpRequest, kind: str, data: dict[str, Any], *, summary: str) -> str:
    """Keep what a POST wanted to do, for the re-authentication that follows; returns its token."""
    if kind not in _finishers:
        raise ValueError(f"no finisher registered for intent {kind!r}")
    token = secrets.token_urlsafe(16)
    request.session[INTENT_SESSION_KEY] = {
        "kind": kind, "data": data, "summary": summary, "token": token,
        "user": getattr(request.user, "pk", None), "at": time.time(),
    }
    return token


def pending_intent(request: HttpRequest, token: str) -> dict[str, Any] | None:
    """The intent ``token`` names, if it is this user's, fresh and finishable; else None."""
    intent = request.session.get(INTENT_SESSION_KEY) if hasattr(request, "session") else None
    if not isinstance(intent, dict) or not token or not isinstance(intent.get("token"), str):
        return None
    if not secrets.compare_digest(intent["token"], token):
        return None
    if intent.get("user") != getattr(request.user, "pk", None) or intent.get("kind") not in _finishers:
        return None
    at = intent.get("at")
    if not isinstance(at, int | float) or time.time() - at > INTENT_MAX_AGE_SECONDS:
        return None
    return intent


def finish_intent(request: HttpRequest, token: str) -> HttpResponse | None:
    """Finish the intent ``token`` names, once (it is forgotten first); None if there is none."""
    intent = pending_intent(request, token)
    request.session.pop(INTENT_SESSION_KEY, None)
    if intent is None:
        return None
    return _finishers[intent["kind"]](request, intent["data"])


def reauth_response(request: HttpRequest, next_url: str, *, intent: str = "") -> HttpResponse:
    """Send the browser to re-authenticate, then back to ``next_url`` (htmx: the whole page goes);
    ``intent``: the token of a remembered intent the password will finish."""
    url = reauth_url(next_url)
    if signed_in_with_oidc(request):
        # No password here to ask for: the provider asks again (accounts/directory/oidc.py). The
        # intent is not carried there; the person is brought back to ``next_url`` to do it again.
        url = f"{reverse('oidc_reauthenticate')}?{urlencode({'next': next_url})}"
    elif intent:
        url += "&" + urlencode({"intent": intent})
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url)


# Who signed in through the lab's OpenID Connect provider re-authenticates there (accounts/directory/oidc.py).
OIDC_BACKEND = "gpuadmin.accounts.directory.oidc.DirectoryOIDCBackend"


def signed_in_with_oidc(request: HttpRequest) -> bool:
    return hasattr(request, "session") and request.session.get(BACKEND_SESSION_KEY) == OIDC_BACKEND


def check_totp(user: Any, code: str) -> bool:
    """Whether ``code`` is a current code of one of the user's confirmed TOTP devices (used once)."""
    from django_otp import match_token

    code = (code or "").strip()
    return bool(code) and match_token(user, code) is not None


def _on_login(sender: Any, request: HttpRequest | None = None, user: Any = None, **_: Any) -> None:
    # A login checked the password (never a TOTP code): it counts only when TOTP is not required.
    if request is not None and hasattr(request, "session"):
        mark_authenticated(request, with_totp=False)


def connect() -> None:
    user_logged_in.connect(_on_login, dispatch_uid="gpuadmin.accounts.sudo.login")
