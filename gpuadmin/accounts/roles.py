"""Roles are Django groups (created by a migration).

- viewer: sees hosts, processes, findings, requests and the audit log.
- requester: also files kill requests.
- approver: also approves or rejects other people's kill requests.

Every role implies viewer; a superuser holds all three.
"""

from __future__ import annotations

# User: the project's user model (settings name no AUTH_USER_MODEL); roles read its groups.
from django.contrib.auth.models import AnonymousUser, User
from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    REQUESTER = "requester", "Requester"
    APPROVER = "approver", "Approver"


def role_names(user: User | AnonymousUser | None) -> set[str]:
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    if user.is_superuser:
        return {r.value for r in Role}
    # Cached on the user object: views ask several times per request.
    cached = getattr(user, "_gpuadmin_roles", None)
    if cached is None:
        cached = set(user.groups.filter(name__in=Role.values).values_list("name", flat=True))
        if cached:
            cached.add(Role.VIEWER.value)
        user._gpuadmin_roles = cached  # type: ignore[attr-defined]  # a cache, not a model field
    return cached


def has_role(user: User | AnonymousUser | None, role: Role | str) -> bool:
    return str(role) in role_names(user)
