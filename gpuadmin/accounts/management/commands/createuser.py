"""python manage.py createuser NAME --role ROLE [--password-env VAR]"""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpuadmin.accounts.roles import Role


class Command(BaseCommand):
    help = "Create (or update) an account with a role: viewer, requester or approver."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--role", required=True, action="append", choices=Role.values,
                            help="repeat for several roles")
        parser.add_argument("--password-env", metavar="VAR",
                            help="read the password from this environment variable instead of a prompt")
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, name: str, role: list[str], password_env: str | None,
               email: str, **options: Any) -> None:
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"environment variable {password_env} is empty or unset")
        else:
            password = getpass.getpass(f"Password for {name}: ")
            if password != getpass.getpass("Again: "):
                raise CommandError("passwords do not match")
        if len(password) < 8:
            raise CommandError("the password must have at least 8 characters")
        user, created = get_user_model().objects.get_or_create(username=name, defaults={"email": email})
        user.set_password(password)
        user.save()
        user.groups.add(*Group.objects.filter(name__in=role))
        verb = "created" if created else "updated"
        self.stdout.write(f"{verb} {name} with role(s) {', '.join(sorted(role))}")
