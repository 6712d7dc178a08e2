"""python manage.py ensure_admin — make sure a superuser exists (used by `make run`).

The name comes from GPUADMIN_ADMIN_USER (default "admin"), the password from
GPUADMIN_ADMIN_PASSWORD. Without a password one is generated and printed once,
when the account is created; an existing account is never changed, so a
password changed on the site stays changed.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gpuadmin.accounts.audit_trail import acting

DEFAULT_ADMIN_USER = "admin"
MIN_PASSWORD_LENGTH = 8


class Command(BaseCommand):
    help = "Create the superuser named by GPUADMIN_ADMIN_USER (default 'admin') unless it exists."

    def handle(self, *args: Any, **options: Any) -> None:
        name = os.environ.get("GPUADMIN_ADMIN_USER") or DEFAULT_ADMIN_USER
        given_password = os.environ.get("GPUADMIN_ADMIN_PASSWORD") or ""
        if given_password and len(given_password) < MIN_PASSWORD_LENGTH:
            raise CommandError(f"GPUADMIN_ADMIN_PASSWORD must have at least {MIN_PASSWORD_LENGTH} characters")
        user_model = get_user_model()
        with transaction.atomic(), acting(via="manage.py ensure_admin"):
            if user_model.objects.filter(username=name).exists():
                self.stdout.write(f"admin account {name!r} exists; left unchanged")
                return
            password = given_password or secrets.token_urlsafe(12)
            user_model.objects.create_superuser(username=name, email="", password=password)
        if given_password:
            self.stdout.write(f"created admin account {name!r} (password from GPUADMIN_ADMIN_PASSWORD)")
        else:
            self.stdout.write(
                f"created admin account {name!r} with password: {password}\n"
                "(shown only this once; change it on the site or with `manage.py changepassword`)"
            )
