"""python manage.py api_token USERNAME [--days N] [--replace | --revoke]

Makes a new API token for USERNAME and prints it, once: only a hash of it is
stored (django-rest-knox), so it cannot be shown again; lost, make another.
Each token expires (GPUADMIN_API_TOKEN_DAYS, default 90, or --days).
``--replace`` revokes the user's other tokens first; ``--revoke`` only
revokes them. Creating and revoking are audit events.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from knox.models import get_token_model

from gpuadmin.accounts.audit_trail import acting


class Command(BaseCommand):
    help = "Print a new API token for USERNAME ('Authorization: Token <token>'), shown only this once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--days", type=int, default=None,
                            help=f"days until it expires (default {settings.GPUADMIN_API_TOKEN_DAYS})")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--replace", "--rotate", action="store_true", dest="replace",
                           help="revoke the user's other tokens first")
        group.add_argument("--revoke", action="store_true", help="revoke all the user's tokens, make none")

    def handle(self, *args: Any, username: str, days: int | None, replace: bool, revoke: bool,
               **options: Any) -> None:
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"no user named {username!r}") from exc
        days = settings.GPUADMIN_API_TOKEN_DAYS if days is None else days
        if days <= 0:
            raise CommandError("--days must be at least 1")
        tokens = get_token_model().objects.filter(user=user)
        with transaction.atomic(), acting(via="manage.py api_token"):
            if replace or revoke:
                # One by one, so each revoked token is its own audit event.
                for token in tokens.select_related("user"):
                    token.delete()
            if revoke:
                self.stderr.write(f"revoked every API token of {username}")
                return
            instance, secret = get_token_model().objects.create(user=user, expiry=timedelta(days=days))
        self.stdout.write(secret)
        self.stderr.write(f"expires {instance.expiry:%Y-%m-%d %H:%M} UTC; shown only this once")
