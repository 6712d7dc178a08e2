"""python manage.py sync_people: people, Unix accounts and roles from the lab's directory now
(beat does it hourly; gpuadmin/notify/people_from_directory.py)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from gpuadmin.accounts import audit_trail
from gpuadmin.notify.people_from_directory import sync_people


class Command(BaseCommand):
    help = "Read people, their Unix accounts (uid, uidNumber) and their roles from the lab's directory."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with audit_trail.acting(None, via="manage.py sync_people"):
                counts = sync_people()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        except Exception as exc:
            if type(exc).__module__.startswith("ldap"):  # the directory's own answer, in its words
                raise CommandError(f"the directory could not be read: {exc}") from None
            raise
        self.stdout.write(f"{counts}.")
