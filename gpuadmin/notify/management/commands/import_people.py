"""python manage.py import_people people.csv [--dry-run]

One account mapping per line; a person is found (or created) by email, else by name:

    name,email,kind,account,host,panel_user,notification_urls
    Alice Liddell,alice@lab.example,unix,alice,,alice,
    Alice Liddell,alice@lab.example,unix,1000,gpu07,,
    Bob,bob@lab.example,slurm,bob,,,slack://T1/B1/XYZ json://hooks.lab/gpu

``kind`` is unix (default) or slurm; ``account`` is a user name, or digits for a uid; ``host``
empty means every host, else a host the panel knows; ``panel_user`` links the person to a panel
account (how approvers and requesters are reached); ``notification_urls`` are Apprise URLs,
space separated, added to the person's. Importing the same file again changes nothing. The
whole file is one transaction: a bad line names its number and nothing is imported.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_email
from django.db import transaction

from gpuadmin.fleet.models import Host
from gpuadmin.notify.models import Account, Person

COLUMNS = ("name", "email", "kind", "account", "host", "panel_user", "notification_urls")


class Command(BaseCommand):
    help = "Map unix and Slurm users to people (and their notification addresses) from a CSV file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument("--dry-run", action="store_true", help="check and count, store nothing")

    def handle(self, *args: Any, path: Path, dry_run: bool, **options: Any) -> None:
        try:
            with path.open(newline="", encoding="utf-8") as handle:
                rows = list(csv.DictReader(handle))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from exc
        counts = {"people": 0, "accounts": 0}
        with transaction.atomic():
            for line, row in enumerate(rows, start=2):  # line 1 is the header
                try:
                    created_person, created_account = _import_row(row)
                except ValueError as exc:
                    raise CommandError(f"{path}, line {line}: {exc}") from None
                counts["people"] += created_person
                counts["accounts"] += created_account
            if dry_run:
                transaction.set_rollback(True)
        verb = "would add" if dry_run else "added"
        self.stdout.write(
            f"{len(rows)} lines: {verb} {counts['people']} people, {counts['accounts']} accounts."
        )


def _field(row: dict[str, Any], name: str) -> str:
    return (row.get(name) or "").strip()


def _import_row(row: dict[str, Any]) -> tuple[bool, bool]:
    unknown = set(row) - set(COLUMNS) - {None}
    if unknown:
        raise ValueError(
            f"unknown column(s) {', '.join(sorted(unknown))}; the columns are {', '.join(COLUMNS)}"
        )
    name, email = _field(row, "name"), _field(row, "email")
    if not name and not email:
        raise ValueError("a person needs a name or an email")
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise ValueError(f"{email!r} is not an email address") from None
    kind = _field(row, "kind") or Account.Kind.UNIX
    if kind not in Account.Kind.values:
        raise ValueError(f"kind must be one of {', '.join(Account.Kind.values)}; got {kind!r}")
    account = _field(row, "account")
    host = None
    if host_name := _field(row, "host"):
        host = Host.objects.filter(name=host_name).first()
        if host is None:
            raise ValueError(f"no host named {host_name!r} (leave it empty for every host)")
    user = None
    if panel_user := _field(row, "panel_user"):
        user = get_user_model().objects.filter(username=panel_user).first()
        if user is None:
            raise ValueError(f"no panel account named {panel_user!r}")

    person = Person.objects.filter(email=email).first() if email else Person.objects.filter(name=name).first()
    created_person = person is None
    if person is None:
        person = Person(name=name or email, email=email)
    if user is not None:
        person.user = user
    urls = person.notification_urls.split()
    urls += [u for u in _field(row, "notification_urls").split() if u not in urls]
    person.notification_urls = "\n".join(urls)
    person.save()

    if not account:
        return created_person, False
    uid = int(account) if account.isdigit() else None
    _, created_account = Account.objects.get_or_create(
        person=person, kind=kind, host=host, name="" if uid is not None else account, uid=uid,
    )
    return created_person, created_account
