"""Sign-in against the lab's LDAP directory (OpenLDAP, FreeIPA, Active Directory) with django-auth-ldap.

Two ways to find a person's entry: a direct bind to GPUADMIN_LDAP_USER_DN_TEMPLATE
("uid=%(user)s,ou=people,dc=lab,dc=example"), or a search under GPUADMIN_LDAP_USER_SEARCH_BASE with
GPUADMIN_LDAP_USER_FILTER (as GPUADMIN_LDAP_BIND_DN, or anonymously), whose filter is also how a lab
says who may not sign in (a disabled account, a shell of nologin). The password always goes over
TLS: ldaps://, or ldap:// with GPUADMIN_LDAP_START_TLS=1, the server's certificate verified against
GPUADMIN_LDAP_CA_FILE (else the system's CAs); plain ldap:// is refused unless
GPUADMIN_LDAP_ALLOW_PLAINTEXT=1 says the network is trusted.

Roles come from the groups under GPUADMIN_LDAP_GROUP_SEARCH_BASE (GPUADMIN_LDAP_GROUP_TYPE:
groupOfNames, groupOfUniqueNames or posixGroup): GPUADMIN_LDAP_VIEWER_GROUP, ..._REQUESTER_GROUP,
..._APPROVER_GROUP name a group's DN each (``directory.roles``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django_auth_ldap.backend import LDAPBackend, ldap_error

from gpuadmin.accounts import audit_trail
from gpuadmin.accounts.directory.roles import apply_roles, roles_for
from gpuadmin.accounts.models import DirectoryIdentity

logger = logging.getLogger(__name__)

VIA_SIGN_IN = "LDAP sign-in"
# Where a failed connection's reason is left for the login page (templates/registration/login.html).
REQUEST_ERROR_ATTRIBUTE = "gpuadmin_directory_error"


class DirectoryLDAPBackend(LDAPBackend):
    """django-auth-ldap's backend, whose people get their roles and Unix account from the directory."""

    def __init__(self) -> None:
        super().__init__()
        # Django's auth makes a backend before each use, and only a backend sends ldap_error: connected
        # here, the receiver is there before the first error, in any process, and not loaded where LDAP
        # is not configured (accounts.apps).
        connect()

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> Any:
        with audit_trail.acting(None, via=VIA_SIGN_IN):
            user = super().authenticate_ldap_user(ldap_user, password)
            return None if user is None else self.from_directory(user, via=VIA_SIGN_IN)

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[Any, bool]:
        user, built = super().get_or_build_user(username, ldap_user)
        if not built and not DirectoryIdentity.objects.filter(user=user,
                                                              source=DirectoryIdentity.Source.LDAP).exists():
            # A local account (the first admin, say) is never taken over by a directory entry of its name.
            logger.warning("LDAP sign-in of %s refused: a local account of that name exists and is not "
                           "the directory's (docs/deploy.md)", username)
            raise ldap_user.AuthenticationFailed("a local account holds this name")
        return user, built

    def refresh(self, user: Any, *, via: str) -> bool:
        """Read ``user``'s entry and groups again (with the bind account): False when the directory no
        longer has them, or its filter excludes them now (then their roles are taken away)."""
        with audit_trail.acting(None, via=via):
            found = self.populate_user(user.get_username())
            if found is None:
                apply_roles(user, set(), via=via)
                return False
            self.from_directory(found, via=via)
            return True

    def from_directory(self, user: Any, *, via: str) -> Any:
        """Record the entry's DN and Unix account, and set the roles its groups give."""
        ldap_user = user.ldap_user
        attrs = ldap_user.attrs or {}
        uid_numbers = [v for v in attrs.get("uidnumber", []) if str(v).isdigit()]
        DirectoryIdentity.objects.update_or_create(
            user=user, defaults={
                "source": DirectoryIdentity.Source.LDAP, "subject": ldap_user.dn,
                "unix_name": (attrs.get("uid") or [""])[0],
                "unix_uid": int(uid_numbers[0]) if uid_numbers else None,
            })
        role_groups = getattr(settings, "GPUADMIN_LDAP_ROLE_GROUPS", {})
        group_dns = ldap_user.group_dns if role_groups else set()
        apply_roles(user, roles_for(group_dns, role_groups, case_insensitive=True), via=via)
        return user


def _directory_error(sender: Any, context: str, user: Any, request: HttpRequest | None, exception: Exception,
                     **_: Any) -> None:
    """Say why the directory could not be asked, in the log and on the login page (not "wrong password")."""
    info = exception.args[0] if exception.args and isinstance(exception.args[0], dict) else {}
    detail = " ".join(str(info.get(k, "")) for k in ("desc", "info")).strip() or str(exception)
    import ldap

    if isinstance(exception, ldap.SERVER_DOWN | ldap.CONNECT_ERROR):
        reason = ("could not reach the directory securely: its TLS certificate was not accepted (is it "
                  "signed by the CA in GPUADMIN_LDAP_CA_FILE, for this host name?) or it is down")
    else:
        reason = "the directory refused the request"
    logger.error("LDAP %s: %s (%s)", context, reason, detail)
    if request is not None:
        setattr(request, REQUEST_ERROR_ATTRIBUTE, f"Signing in through the directory failed: {reason}.")


def connect() -> None:
    ldap_error.connect(_directory_error, dispatch_uid="gpuadmin.accounts.directory.ldap.error")


VIA_SYNC = "directory sync"


@dataclass(frozen=True)
class PosixPerson:
    """One posixAccount of the directory: who owns uid ``unix_uid`` (``unix_name``) on every host."""

    dn: str
    unix_name: str
    unix_uid: int | None
    name: str
    email: str


def _first(attrs: dict[str, list[bytes]], name: str) -> str:
    values = attrs.get(name) or [b""]
    return values[0].decode("utf-8", errors="replace").strip()


def _setting(name: str) -> Any:
    # Set only when GPUADMIN_LDAP_SERVER_URI is (directory.config): not every settings module has them.
    return getattr(settings, name)


def posix_people() -> list[PosixPerson]:
    """Everyone GPUADMIN_LDAP_USER_FILTER lets sign in, read with the bind account (search mode only)."""
    import ldap

    base = getattr(settings, "GPUADMIN_LDAP_USER_SEARCH_BASE", "")
    if not getattr(settings, "AUTH_LDAP_SERVER_URI", "") or not base:
        raise ImproperlyConfigured("reading people from LDAP needs GPUADMIN_LDAP_SERVER_URI and "
                                   "GPUADMIN_LDAP_USER_SEARCH_BASE (and GPUADMIN_LDAP_BIND_DN if the "
                                   "directory is not readable anonymously)")
    connection = ldap.initialize(_setting("AUTH_LDAP_SERVER_URI"))
    for option, value in _setting("AUTH_LDAP_CONNECTION_OPTIONS").items():
        connection.set_option(option, value)
    try:
        if _setting("AUTH_LDAP_START_TLS"):
            connection.start_tls_s()
        connection.simple_bind_s(_setting("AUTH_LDAP_BIND_DN"), _setting("AUTH_LDAP_BIND_PASSWORD"))
        search_filter = _setting("GPUADMIN_LDAP_USER_FILTER").replace("%(user)s", "*")
        found = connection.search_s(base, ldap.SCOPE_SUBTREE, search_filter,
                                    ["uid", "uidNumber", "cn", "mail"])
    finally:
        connection.unbind_s()
    people = []
    for dn, attrs in found:
        if dn is None or not isinstance(attrs, dict):
            continue  # a referral
        number = _first(attrs, "uidNumber")
        people.append(PosixPerson(dn=dn, unix_name=_first(attrs, "uid"),
                                  unix_uid=int(number) if number.isdigit() else None,
                                  name=_first(attrs, "cn") or _first(attrs, "uid"),
                                  email=_first(attrs, "mail")))
    return people


def refresh_signed_in_people() -> tuple[int, int]:
    """Read again every LDAP person who signed in here: their roles and Unix account now, or (gone from
    the directory, or excluded by its filter) no roles. Returns (refreshed, taken off)."""
    backend = DirectoryLDAPBackend()
    refreshed = gone = 0
    identities = DirectoryIdentity.objects.filter(source=DirectoryIdentity.Source.LDAP).select_related("user")
    for identity in identities:
        if backend.refresh(identity.user, via=VIA_SYNC):
            refreshed += 1
        else:
            gone += 1
    return refreshed, gone
