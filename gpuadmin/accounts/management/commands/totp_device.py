"""python manage.py totp_device USERNAME [--remove]

Gives USERNAME a TOTP device (django-otp) and prints its otpauth:// URL once,
for an authenticator app (paste it, or turn it into a QR code with
``qrencode -t ansiutf8``). With GPUADMIN_REQUIRE_TOTP_FOR_APPROVAL=1 an
approver re-authenticates with a code from it (gpuadmin/accounts/sudo.py).
A user has at most one: a new one replaces the old. ``--remove`` removes it.
Both are audit events. The admin site (OTP_TOTP) can do the same.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpuadmin.accounts.audit_trail import acting

DEVICE_NAME = "authenticator"


class Command(BaseCommand):
    help = "Give USERNAME a TOTP device for approving; print its otpauth:// URL once (--remove: remove it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--remove", action="store_true", help="remove the user's TOTP device")

    def handle(self, *args: Any, username: str, remove: bool, **options: Any) -> None:
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"no user named {username!r}") from exc
        with transaction.atomic(), acting(via="manage.py totp_device"):
            for device in TOTPDevice.objects.filter(user=user).select_related("user"):
                device.delete()
            if remove:
                self.stderr.write(f"removed the TOTP device of {username}")
                return
            device = TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=True)
        self.stdout.write(device.config_url)
        self.stderr.write("add it to an authenticator app now; it is not shown again")
