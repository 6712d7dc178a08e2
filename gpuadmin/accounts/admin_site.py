"""The admin site, behind the same recent re-authentication as approving (``sudo.py``).

The admin site can set anyone's password, roles and TOTP devices: with a stale session it could
make a second approver out of thin air. So every admin page needs a login or re-authentication
within GPUADMIN_REAUTH_MAX_AGE_SECONDS (and with TOTP when approving needs it); an older session
is sent to ``/reauthenticate/`` and back. Logging out never asks.

settings.INSTALLED_APPS names ``SudoAdminConfig`` in place of ``django.contrib.admin``, Django's
way to replace the default site (``admin.site``) that every ``@admin.register`` uses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any, TypeVar, cast

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.http import HttpRequest, HttpResponseBase
from django.urls import reverse

from gpuadmin.accounts import sudo

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class SudoAdminSite(admin.AdminSite):
    def admin_view(self, view: View, cacheable: bool = False) -> View:
        def recently_authenticated(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            # Runs inside Django's own wrapper, after it sent anyone without admin access to log in.
            logging_out = request.path == reverse("admin:logout", current_app=self.name)
            if not logging_out and not sudo.recently_authenticated(request):
                return sudo.reauth_response(request, request.get_full_path())
            return view(request, *args, **kwargs)

        return cast(View, super().admin_view(update_wrapper(recently_authenticated, view), cacheable))


class SudoAdminConfig(AdminConfig):
    default_site = "gpuadmin.accounts.admin_site.SudoAdminSite"
