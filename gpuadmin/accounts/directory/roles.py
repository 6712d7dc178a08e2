"""A directory person's roles are what the directory's groups say, and nothing else.

The mapping is one group per role (an LDAP group's DN, a value of an OpenID Connect claim), from
the environment. Applying it changes the account's Django groups only where they differ, through
``user.groups``: the audit trail's receivers record each change (``ROLES_CHANGED``, with ``via``
naming the directory), and ``roles.role_names`` reads the groups on every request, so an API token
of someone who lost a role stops working for what the role allowed at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth.models import Group
from django.utils import timezone

from gpuadmin.accounts import audit_trail
from gpuadmin.accounts.models import DirectoryIdentity
from gpuadmin.accounts.roles import Role


def roles_for(groups: Iterable[str], role_groups: Mapping[str, str], *, case_insensitive: bool) -> set[str]:
    """The roles whose directory group is among ``groups`` (LDAP DNs compare without case)."""
    norm = (lambda s: s.lower()) if case_insensitive else (lambda s: s)
    held = {norm(g) for g in groups}
    return {role for role, group in role_groups.items() if norm(group) in held}


def apply_roles(user: Any, roles: set[str], *, via: str) -> None:
    """Make ``user``'s roles exactly ``roles`` (those the mapping names; superuser is not a role here)."""
    unknown = roles - set(Role.values)
    if unknown:
        raise ValueError(f"not roles: {', '.join(sorted(unknown))}")
    current = set(user.groups.filter(name__in=Role.values).values_list("name", flat=True))
    with audit_trail.acting(None, via=via):
        if added := roles - current:
            user.groups.add(*Group.objects.filter(name__in=added))
        if removed := current - roles:
            user.groups.remove(*Group.objects.filter(name__in=removed))
    # roles.role_names caches on the user object: this one must see the new roles.
    user.__dict__.pop("_gpuadmin_roles", None)
    DirectoryIdentity.objects.filter(user=user).update(roles_checked_at=timezone.now())
