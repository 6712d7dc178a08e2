"""Role checks for DRF views and plain Django views."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import BasePermission

from gpuadmin.accounts.roles import Role, has_role


class _HasRole(BasePermission):
    role: Role = Role.VIEWER
    message = "This needs the viewer role."

    def has_permission(self, request: Any, view: Any) -> bool:
        return has_role(request.user, self.role)


class IsViewer(_HasRole):
    role = Role.VIEWER
    message = "This needs the viewer role."


def role_required(role: Role) -> Callable:
    """Login first (redirect), then the role (403)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        @login_required
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not has_role(request.user, role):
                raise PermissionDenied(f"This needs the {role.value} role.")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator
