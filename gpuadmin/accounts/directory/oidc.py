"""Sign-in with the lab's OpenID Connect provider (Keycloak, Dex, Authentik, a university's SSO).

mozilla-django-oidc does the authorization code flow with PKCE, state and nonce; it is small and
maintained, and its request view lets a subclass set the authorization request's parameters per
request, which re-authentication needs (``prompt=login``, ``max_age=0``). What it leaves to its
user is done here: the ID token's issuer and audience are checked (the library checks only the
signature, the expiry and the nonce), a person is their provider's ``sub`` (never an email or a
name another account may hold), their roles are the groups claim's (``directory.roles``), and a
sign-in counts for approving only from the ``auth_time`` the provider vouches for.

Re-authentication (``reauthenticate``) sends the person back to the provider with
``prompt=login`` and ``max_age=0``; the callback accepts it only for the same person, and only
with an ``auth_time`` not older than the moment it was asked for: a provider that answered from
its own session without asking counts for nothing. With GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL, it
counts only when the ID token's ``amr`` says a second factor was used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from gpuadmin.accounts import audit_trail, sudo
from gpuadmin.accounts.directory.roles import apply_roles, roles_for
from gpuadmin.accounts.models import DirectoryIdentity
from gpuadmin.audit.models import Action

logger = logging.getLogger(__name__)

VIA_SIGN_IN = "OpenID Connect sign-in"
VIA_REAUTH = "OpenID Connect re-authentication"
REAUTH_SESSION_KEY = "gpuadmin_oidc_reauth"
# The provider's clock and ours may differ by this much.
CLOCK_SKEW_SECONDS = 30
# What in ``amr`` (RFC 8176) says a second factor was used.
SECOND_FACTOR_AMR = frozenset({"otp", "mfa", "hwk", "sms", "swk"})
# Where the verified ID token's claims are left for the callback view, on the request.
CLAIMS_ATTRIBUTE = "gpuadmin_oidc_claims"


def _setting(name: str) -> Any:
    # Set only when GPUADMIN_OIDC_CLIENT_ID is (directory.config): not every settings module has them.
    return getattr(settings, name)


def configured() -> bool:
    return bool(getattr(settings, "OIDC_RP_CLIENT_ID", ""))


def provider_name() -> str:
    return str(getattr(settings, "GPUADMIN_OIDC_PROVIDER_NAME", "")) if configured() else ""


def check_id_token_claims(claims: dict[str, Any], *, issuer: str, client_id: str) -> None:
    """Refuse an ID token meant for another client or from another issuer (OIDC Core 3.1.3.7)."""
    if claims.get("iss") != issuer:
        raise SuspiciousOperation(f"ID token issuer {claims.get('iss')!r} is not {issuer!r}")
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if client_id not in audiences:
        raise SuspiciousOperation(f"ID token audience {audience!r} does not name this client")
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise SuspiciousOperation("ID token with several audiences is not authorized for this client")
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SuspiciousOperation("ID token without a subject")


def _auth_time(claims: dict[str, Any]) -> float | None:
    value = claims.get("auth_time")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class DirectoryOIDCBackend(OIDCAuthenticationBackend):
    def verify_token(self, token: str, **kwargs: Any) -> Any:
        claims = super().verify_token(token, **kwargs)
        check_id_token_claims(claims, issuer=_setting("GPUADMIN_OIDC_ISSUER"),
                              client_id=self.OIDC_RP_CLIENT_ID)
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        user_info = self.get_userinfo(access_token, id_token, payload)
        if user_info.get("sub") != payload["sub"]:
            raise SuspiciousOperation("the userinfo's subject is not the ID token's")
        claims = {**user_info, **payload}
        reauth = self.request.session.get(REAUTH_SESSION_KEY)
        with audit_trail.acting(None, via=VIA_REAUTH if reauth else VIA_SIGN_IN):
            user = self._person(claims)
            if user is None:
                return None
            if isinstance(reauth, dict) and not _fresh_reauthentication(reauth, user, claims):
                return None
            apply_roles(user, self._roles(claims), via=VIA_REAUTH if reauth else VIA_SIGN_IN)
        setattr(self.request, CLAIMS_ATTRIBUTE, claims)
        return user

    def _person(self, claims: dict[str, Any]) -> Any:
        subject = f"{_setting('GPUADMIN_OIDC_ISSUER')} {claims['sub']}"
        identity = (DirectoryIdentity.objects.select_related("user")
                    .filter(source=DirectoryIdentity.Source.OIDC, subject=subject).first())
        user_model = get_user_model()
        if identity is None:
            username = str(claims.get(_setting("GPUADMIN_OIDC_USERNAME_CLAIM")) or "")
            if not username or len(username) > 150:
                logger.warning("OpenID Connect sign-in refused: no usable %s claim",
                               _setting("GPUADMIN_OIDC_USERNAME_CLAIM"))
                return None
            if user_model.objects.filter(username__iexact=username).exists():
                logger.warning("OpenID Connect sign-in of %s refused: an account of that name exists and is "
                               "not this provider's person (docs/deploy.md)", username)
                return None
            user = user_model.objects.create_user(username, email=claims.get("email") or "")
            identity = DirectoryIdentity.objects.create(user=user, source=DirectoryIdentity.Source.OIDC,
                                                        subject=subject)
        user = identity.user
        changed = []
        for field, claim in (("email", "email"), ("first_name", "given_name"), ("last_name", "family_name")):
            value = claims.get(claim)
            if isinstance(value, str) and value != getattr(user, field):
                setattr(user, field, value[:150])
                changed.append(field)
        if changed:
            user.save(update_fields=changed)
        self._unix_account(identity, claims)
        return user

    def _unix_account(self, identity: DirectoryIdentity, claims: dict[str, Any]) -> None:
        name_claim = _setting("GPUADMIN_OIDC_UNIX_NAME_CLAIM")
        uid_claim = _setting("GPUADMIN_OIDC_UNIX_UID_CLAIM")
        name = claims.get(name_claim) if name_claim else None
        uid = claims.get(uid_claim) if uid_claim else None
        identity.unix_name = name if isinstance(name, str) else ""
        identity.unix_uid = int(str(uid)) if str(uid).isdigit() else None
        identity.save(update_fields=["unix_name", "unix_uid"])

    def _roles(self, claims: dict[str, Any]) -> set[str]:
        groups = claims.get(_setting("GPUADMIN_OIDC_GROUPS_CLAIM"), [])
        if isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list):
            groups = []
        return roles_for([str(g) for g in groups], _setting("GPUADMIN_OIDC_ROLE_GROUPS"),
                         case_insensitive=False)


def _fresh_reauthentication(reauth: dict[str, Any], user: Any, claims: dict[str, Any]) -> bool:
    if reauth.get("user") != user.pk:
        logger.warning("OpenID Connect re-authentication refused: %s signed in at the provider, not the "
                       "session's person", user.get_username())
        return False
    auth_time, asked_at = _auth_time(claims), reauth.get("at")
    if (auth_time is None or not isinstance(asked_at, int | float)
            or auth_time < asked_at - CLOCK_SKEW_SECONDS):
        logger.warning("OpenID Connect re-authentication of %s refused: the provider did not ask again "
                       "(auth_time %s, asked at %s)", user.get_username(), claims.get("auth_time"), asked_at)
        return False
    return True


def _with_second_factor(claims: dict[str, Any]) -> bool:
    amr = claims.get("amr")
    return isinstance(amr, list) and bool(SECOND_FACTOR_AMR & {str(a) for a in amr})


class SignInView(OIDCAuthenticationRequestView):
    """The "Sign in with <provider>" link: off to the provider (404 when none is configured)."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        request.session.pop(REAUTH_SESSION_KEY, None)
        return super().dispatch(request, *args, **kwargs)


class ReauthenticateView(OIDCAuthenticationRequestView):
    """Back to the provider, which must ask the person again (prompt=login, max_age=0)."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        request.session[REAUTH_SESSION_KEY] = {"user": request.user.pk, "at": time.time()}
        return super().dispatch(request, *args, **kwargs)

    def get_extra_params(self, request: HttpRequest) -> dict[str, str]:
        return {**super().get_extra_params(request), "prompt": "login", "max_age": "0"}


class CallbackView(OIDCAuthenticationCallbackView):
    def login_success(self) -> HttpResponse:
        request = self.request
        reauth = request.session.pop(REAUTH_SESSION_KEY, None)
        response = super().login_success()
        claims = getattr(request, CLAIMS_ATTRIBUTE, {})
        with_totp = sudo.totp_required() and _with_second_factor(claims)
        # A sign-in counts for approving from when the provider last asked the person, not from now.
        sudo.mark_authenticated(request, with_totp=with_totp, at=_auth_time(claims) or 0.0)
        if reauth:
            with audit_trail.acting(self.user, via=VIA_REAUTH):
                audit_trail.record(Action.REAUTHENTICATED, self.user.get_username(), totp=with_totp)
        return response

    def login_failure(self) -> HttpResponse:
        self.request.session.pop(REAUTH_SESSION_KEY, None)
        return super().login_failure()


def _when_configured(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    # The library's views read their settings when made: without a provider they are not made at all.
    @wraps(view)
    def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not configured():
            raise Http404("no OpenID Connect provider is configured")
        return view(request, *args, **kwargs)

    return answer


sign_in = _when_configured(SignInView.as_view())
callback = _when_configured(CallbackView.as_view())
reauthenticate = _when_configured(login_required(ReauthenticateView.as_view()))

