"""python manage.py accept_host NAME [--fingerprint F] [--public-key K] — trust a host's key.

Without ``--public-key``: accept the key the host offered with its first
signed snapshot (the panel shows it, with its fingerprint, to approvers).
``--fingerprint`` makes sure it is the key its agent logged. With
``--public-key`` the host is enrolled before it sent anything (``make run``
does this for its own agent). Every acceptance is an audit event.
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gpuadmin.fleet.intake import trust
from gpuadmin.fleet.models import Host

COMMAND_ACTOR = "manage.py accept_host"


class Command(BaseCommand):
    help = "Accept a host's key, so that its snapshots and kill reports count and orders go to it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="the host's name, as its agent's GPUADMIN_HOST_NAME")
        parser.add_argument("--fingerprint", default="", help="the key's fingerprint as the agent logged it")
        parser.add_argument("--public-key", default="", help="enrol with this key ('ed25519:...')")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            host = trust.accept_host(
                options["name"], actor_name=f"{getpass.getuser()} ({COMMAND_ACTOR})",
                expected_fingerprint=options["fingerprint"], public_key=options["public_key"],
            )
        except Host.DoesNotExist:
            raise CommandError(
                f"no host named {options['name']!r}; start its agent, or give --public-key"
            ) from None
        except (trust.KeyMismatch, ValueError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"accepted host {host.name} with key {host.key_fingerprint}")
