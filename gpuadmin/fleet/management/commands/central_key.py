"""python manage.py central_key — print central's public key, one line, for every agent to pin.

Give the line to each agent as GPUADMIN_CENTRAL_PUBLIC_KEY (or put it in the
file named by GPUADMIN_CENTRAL_PUBLIC_KEY_FILE); with ``--fingerprint`` the
fingerprint is printed too, to compare with what an agent logs.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gpuadmin.keys import KeyMissing, central_signing_key
from gpuadmin.wire.signing import fingerprint, public_key_text


class Command(BaseCommand):
    help = "Print central's public key (GPUADMIN_CENTRAL_PUBLIC_KEY for agents)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--fingerprint", action="store_true", help="also print its fingerprint")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            key = central_signing_key()
        except (KeyMissing, ValueError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(public_key_text(key))
        if options["fingerprint"]:
            self.stdout.write(fingerprint(key))
