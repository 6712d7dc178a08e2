"""Every change to accounts, roles, API tokens and TOTP devices becomes an audit event.

The events come from model signals, not from the code paths that make the
changes, so a change through the admin site, a management command or the
shell is recorded the same way. Who acted is not known to a signal: the web
request (``ActorMiddleware``) or the command (``acting(via=...)``) says it
through a context variable; a change with neither is recorded with no actor
and ``via: "unknown"`` (a shell session, a migration).

A change to someone else's credentials (creation, password, roles, TOTP devices, API tokens) is
also noted by ``credential_changes.note``, which holds that account's approvals for a day.

The account concerned is ``details["user"]``; its roles are named, never its
groups' ids. Passwords and token secrets never reach the log: a password
change is recorded as "password" in the changed fields, a token by the first
characters knox keeps in clear (``token_key``) to tell tokens apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from gpuadmin.accounts import credential_changes
from gpuadmin.accounts.models import CredentialChange
from gpuadmin.accounts.roles import Role
from gpuadmin.audit import log
from gpuadmin.audit.models import Action

# What an account change is worth recording for; last_login changes on every login.
TRACKED_USER_FIELDS = ("username", "email", "first_name", "last_name", "is_active", "is_staff",
                       "is_superuser", "password")


@dataclass(frozen=True)
class Actor:
    user: AbstractBaseUser | AnonymousUser | None
    via: str


_actor: ContextVar[Actor | None] = ContextVar("gpuadmin_account_actor", default=None)


@contextlib.contextmanager
def acting(user: AbstractBaseUser | AnonymousUser | None = None, *, via: str) -> Iterator[None]:
    """Attribute the account changes made inside to ``user`` (or nobody), made ``via`` a command or page."""
    token = _actor.set(Actor(user, via))
    try:
        yield
    finally:
        _actor.reset(token)


class ActorMiddleware:
    """Changes made while serving a request are the logged-in user's (the admin site's, mostly)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with acting(getattr(request, "user", None), via=f"web {request.path}"):
            return self.get_response(request)


def _acting_user() -> Any:
    """The logged-in person making the change, or None (a command, a shell)."""
    actor = _actor.get()
    user = actor.user if actor is not None else None
    return user if user is not None and user.is_authenticated else None


def record(action: Action, user_name: str, **details: Any) -> None:
    actor = _actor.get() or Actor(None, "unknown")
    log.record(action, actor=_acting_user(), details={"user": user_name, "via": actor.via, **details})


def _credentials(user: Any, kind: CredentialChange.Kind, detail: str = "") -> None:
    credential_changes.note(user, kind, detail, actor=_acting_user())


# Fields of an account that say what it may do; its password says who can sign in as it.
ROLE_FIELDS = ("is_superuser", "is_staff")


# --- accounts -----------------------------------------------------------------------


def _tracked(user: Any) -> dict[str, Any]:
    return {name: getattr(user, name) for name in TRACKED_USER_FIELDS}


def _remember_before(sender: Any, instance: Any, raw: bool = False, **_: Any) -> None:
    if raw or instance.pk is None:
        return
    before = sender.objects.filter(pk=instance.pk).values(*TRACKED_USER_FIELDS).first()
    instance._gpuadmin_before = before


def _user_saved(sender: Any, instance: Any, created: bool, raw: bool = False,
                update_fields: Any = None, **_: Any) -> None:
    if raw:
        return
    if created:
        record(Action.USER_CREATED, instance.get_username(), is_superuser=instance.is_superuser,
               is_active=instance.is_active)
        _credentials(instance, CredentialChange.Kind.CREATED)
        return
    before = getattr(instance, "_gpuadmin_before", None)
    instance._gpuadmin_before = None
    if before is None:
        return
    now = _tracked(instance)
    changed = sorted(name for name in TRACKED_USER_FIELDS if before[name] != now[name])
    if not changed:
        return
    # Values of flags and names are worth keeping; a password hash is not.
    values = {name: now[name] for name in changed if name != "password"}
    record(Action.USER_CHANGED, instance.get_username(), changed=changed, now=values,
           **({"previous_username": before["username"]} if "username" in changed else {}))
    if "password" in changed:
        _credentials(instance, CredentialChange.Kind.PASSWORD)
    if roles := [f"{name}: {values[name]}" for name in ROLE_FIELDS if name in changed]:
        _credentials(instance, CredentialChange.Kind.ROLES, ", ".join(roles))


def _user_deleted(sender: Any, instance: Any, **_: Any) -> None:
    record(Action.USER_DELETED, instance.get_username())


# --- roles (Django groups named after a Role) ------------------------------------------


def _role_names(group_pks: set[int] | None) -> list[str]:
    if not group_pks:
        return []
    return sorted(Group.objects.filter(pk__in=group_pks, name__in=Role.values).values_list("name", flat=True))


def _roles_of(user: Any) -> list[str]:
    return sorted(user.groups.filter(name__in=Role.values).values_list("name", flat=True))


def _groups_changed(sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None,
                    **_: Any) -> None:
    user_model = get_user_model()
    if action == "pre_clear":
        # Clearing does not say what it removes: note it before it goes.
        if reverse:
            instance._gpuadmin_cleared = (
                [instance.name] if instance.name in Role.values else [],
                list(instance.user_set.all()),
            )
        else:
            instance._gpuadmin_cleared = (_roles_of(instance), [instance])
        return
    if action not in ("post_add", "post_remove", "post_clear"):
        return
    if action == "post_clear":
        roles, users = getattr(instance, "_gpuadmin_cleared", ([], []))
    elif reverse:  # group.user_set.add(...): one role, several users
        roles = [instance.name] if instance.name in Role.values else []
        users = list(user_model.objects.filter(pk__in=pk_set or ()))
    else:  # user.groups.add(...): one user, several groups
        roles, users = _role_names(pk_set), [instance]
    if not roles:
        return
    key = "added" if action == "post_add" else "removed"
    for user in users:
        record(Action.ROLES_CHANGED, user.get_username(), **{key: roles}, roles=_roles_of(user))
        _credentials(user, CredentialChange.Kind.ROLES, f"{key}: {', '.join(roles)}")


# --- API tokens and TOTP devices ------------------------------------------------------------


def _token_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **_: Any) -> None:
    if created and not raw:
        expiry = instance.expiry.isoformat(timespec="seconds") if instance.expiry else None
        record(Action.TOKEN_CREATED, instance.user.get_username(), token=instance.token_key, expires=expiry)
        _credentials(instance.user, CredentialChange.Kind.API_TOKEN, f"created {instance.token_key}")


def _token_deleted(sender: Any, instance: Any, **_: Any) -> None:
    # knox deletes an expired token when it is next presented.
    expired = instance.expiry is not None and instance.expiry <= timezone.now()
    record(Action.TOKEN_REVOKED, instance.user.get_username(), token=instance.token_key,
           reason="expired" if expired else "revoked")


def _device_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **_: Any) -> None:
    if raw:
        return
    if created:
        record(Action.TOTP_DEVICE_ADDED, instance.user.get_username(), device=instance.name)
    # Not only a new device: another person editing one (its key, in the admin) can then make its codes.
    # The holder's own saves (django-otp's counters at each code) are not someone else's doing.
    _credentials(instance.user, CredentialChange.Kind.TOTP_DEVICE,
                 f"{'added' if created else 'changed'} {instance.name}")


def _device_deleted(sender: Any, instance: Any, **_: Any) -> None:
    record(Action.TOTP_DEVICE_REMOVED, instance.user.get_username(), device=instance.name)
    _credentials(instance.user, CredentialChange.Kind.TOTP_DEVICE, f"removed {instance.name}")


# --- sign-in --------------------------------------------------------------------------------


def _locked_out(sender: Any, request: Any = None, username: str | None = None, ip_address: str | None = None,
                **_: Any) -> None:
    log.record(Action.LOGIN_LOCKED_OUT, details={"user": username or "", "address": ip_address or ""})


def _receivers() -> list[tuple[Any, Callable[..., None], Any, str]]:
    """(signal, receiver, sender, dispatch uid) for every change recorded here."""
    from axes.signals import user_locked_out
    from django_otp.plugins.otp_totp.models import TOTPDevice
    from knox.models import get_token_model

    user_model = get_user_model()
    token_model = get_token_model()
    uid = "gpuadmin.accounts.audit_trail"
    return [
        (pre_save, _remember_before, user_model, f"{uid}.before"),
        (post_save, _user_saved, user_model, f"{uid}.user_saved"),
        (post_delete, _user_deleted, user_model, f"{uid}.user_deleted"),
        (m2m_changed, _groups_changed, user_model.groups.through, f"{uid}.groups"),
        (post_save, _token_saved, token_model, f"{uid}.token_saved"),
        (post_delete, _token_deleted, token_model, f"{uid}.token_deleted"),
        (post_save, _device_saved, TOTPDevice, f"{uid}.device_saved"),
        (post_delete, _device_deleted, TOTPDevice, f"{uid}.device_deleted"),
        (user_locked_out, _locked_out, None, f"{uid}.locked_out"),
    ]


def connect() -> None:
    """Called once from AccountsConfig.ready()."""
    for signal, receiver, sender, uid in _receivers():
        signal.connect(receiver, sender=sender, dispatch_uid=uid)


def disconnect() -> None:
    """The opposite of connect(); for tests whose people need not be in the log."""
    for signal, _receiver, sender, uid in _receivers():
        signal.disconnect(sender=sender, dispatch_uid=uid)
