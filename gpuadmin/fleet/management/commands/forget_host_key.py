"""python manage.py forget_host_key NAME — drop a host's key so that it can enrol again (re-key).

The host's next signed snapshot offers its (new) key, which waits for an
approver's acceptance like a new host's. Until then nothing it sends counts
and no order goes to it. The change is an audit event.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Host


class Command(BaseCommand):
    help = "Forget a host's key; its next snapshot offers a key for acceptance again."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            host = trust.forget_host_key(options["name"],
                                         actor_name=f"{getpass.getuser()} (manage.py forget_host_key)")
        except Host.DoesNotExist:
            raise CommandError(f"no host named {options['name']!r}") from None
        self.stdout.write(f"forgot the key of host {host.name}; its next snapshot offers one for acceptance")
