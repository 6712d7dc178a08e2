"""python manage.py createuser NAME --role ROLE [--role ...] [--update] [--password-env VAR | --keep-password]

Creates an account with exactly the roles given. An existing account is
changed only with ``--update``: its roles become exactly the ones given (so a
role left out is removed), and its password is replaced unless
``--keep-password``. The password must pass the site's validators (length,
common passwords). Every change is an audit event (gpuadmin/accounts/audit_trail.py).
"""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from gpuadmin.accounts.audit_trail import acting
from gpuadmin.accounts.roles import Role


class Command(BaseCommand):
    help = "Create an account with roles (viewer, requester, approver); --update changes an existing one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--role", required=True, action="append", choices=Role.values,
                            help="repeat for several roles; the account gets exactly these")
        parser.add_argument("--update", action="store_true",
                            help="change an existing account (its roles become exactly --role)")
        parser.add_argument("--password-env", metavar="VAR",
                            help="read the password from this environment variable instead of a prompt")
        parser.add_argument("--keep-password", action="store_true",
                            help="with --update: leave the password as it is")
        parser.add_argument("--email", default=None)

    def handle(self, *args: Any, name: str, role: list[str], update: bool, password_env: str | None,
               keep_password: bool, email: str | None, **options: Any) -> None:
        user_model = get_user_model()
        existing = user_model.objects.filter(username=name).first()
        if existing is not None and not update:
            raise CommandError(f"an account named {name!r} exists; add --update to change it")
        if existing is None and update:
            raise CommandError(f"no account named {name!r} to update; leave out --update to create it")
        if keep_password and existing is None:
            raise CommandError("--keep-password needs an existing account (--update)")
        password = None if keep_password else self._password(name, password_env)
        if password is not None:
            try:
                validate_password(password, user=existing or user_model(username=name))
            except ValidationError as error:
                raise CommandError(" ".join(error.messages)) from None
        roles = sorted(set(role))
        with transaction.atomic(), acting(via="manage.py createuser"):
            user = existing or user_model(username=name)
            if email is not None:
                user.email = email
            if password is not None:
                user.set_password(password)
            user.save()
            # set() adds and removes only the difference, so each change is one audit event.
            others = user.groups.exclude(name__in=Role.values)
            user.groups.set([*others, *Group.objects.filter(name__in=roles)])
        verb = "updated" if existing else "created"
        self.stdout.write(f"{verb} {name} with role(s) {', '.join(roles)}")

    def _password(self, name: str, password_env: str | None) -> str:
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"environment variable {password_env} is empty or unset")
            return password
        password = getpass.getpass(f"Password for {name}: ")
        if password != getpass.getpass("Again: "):
            raise CommandError("passwords do not match")
        return password
