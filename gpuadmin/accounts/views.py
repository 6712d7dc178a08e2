"""The re-authentication page ("sudo mode", gpuadmin/accounts/sudo.py) and the lockout page.

The password goes through ``authenticate()`` with the request, so django-axes
counts a wrong one here as it does on the login page, and locks the same way.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods

from gpuadmin.accounts import audit_trail, sudo
from gpuadmin.audit.models import Action


def _safe_next(request: HttpRequest, candidate: str) -> str:
    if candidate and url_has_allowed_host_and_scheme(candidate, allowed_hosts={request.get_host()},
                                                     require_https=request.is_secure()):
        return candidate
    return reverse("kill_requests")


@require_http_methods(["GET", "POST"])
@login_required
def reauthenticate(request: HttpRequest) -> HttpResponse:
    next_url = _safe_next(request, request.POST.get("next") or request.GET.get("next", ""))
    if sudo.signed_in_with_oidc(request):
        # No password here: the provider asks again (accounts/directory/oidc.py).
        return sudo.reauth_response(request, next_url)
    intent_token = request.POST.get("intent") or request.GET.get("intent", "")
    intent = sudo.pending_intent(request, intent_token)
    user = request.user
    wants_totp = sudo.totp_required()
    has_device = wants_totp and _has_totp_device(user)
    error = ""
    if request.method == "POST":
        password = request.POST.get("password", "")
        checked = authenticate(request, username=user.get_username(), password=password)
        if getattr(request, "axes_locked_out", False):
            # AxesMiddleware answers with the lockout page.
            return HttpResponse(status=429)
        if checked is None or checked.pk != user.pk:
            error = "That password is not right."
        elif wants_totp and not has_device:
            error = "Approving needs a TOTP device, and this account has none."
        elif wants_totp and not sudo.check_totp(user, request.POST.get("totp", "")):
            error = "That code is not right (or was used already); wait for the next one."
        else:
            sudo.mark_authenticated(request, with_totp=wants_totp)
            with audit_trail.acting(user, via="web re-authentication"):
                audit_trail.record(Action.REAUTHENTICATED, user.get_username(), totp=wants_totp)
            # The POST that was sent here is finished now (CSRF-checked, the token echoed), not redone.
            finished = sudo.finish_intent(request, intent_token) if intent else None
            return finished or HttpResponseRedirect(next_url)
    context = {
        "next": next_url,
        "intent": intent,
        "error": error,
        "wants_totp": wants_totp,
        "has_device": has_device,
        "max_age_minutes": settings.GPUADMIN_REAUTH_MAX_AGE_SECONDS // 60,
    }
    return render(request, "registration/reauthenticate.html", context, status=400 if error else 200)


def _has_totp_device(user: object) -> bool:
    from django_otp import devices_for_user

    return any(True for _ in devices_for_user(user, confirmed=True))


def locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
               credentials: dict[str, Any] | None = None) -> HttpResponse:
    """django-axes' answer to a locked-out login (settings.AXES_LOCKOUT_CALLABLE), in words."""
    from axes.helpers import get_client_username

    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "username": get_client_username(request, credentials) or "",
        "lockout_minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60),
    }
    return render(request, "registration/locked_out.html", context, status=429)
