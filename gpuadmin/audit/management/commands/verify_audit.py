"""python manage.py verify_audit [--anchor SEQUENCE:HASH]

Recomputes the audit log's hash chain. Exits 0 and prints
"audit chain OK: N events", or exits 1 naming the first bad event.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpuadmin.audit.models import AuditEvent


def _parse_anchor(text: str) -> tuple[int, str]:
    sequence, _, hash_hex = text.partition(":")
    if not sequence.isdigit() or len(hash_hex) != 64:
        raise CommandError(f"--anchor must be SEQUENCE:HASH (64 hex digits), not {text!r}")
    return int(sequence), hash_hex.lower()


class Command(BaseCommand):
    help = "Recompute the audit log's hash chain and name the first bad event."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--anchor",
            metavar="SEQUENCE:HASH",
            help="A head printed by an earlier run: also check that this event is still there, unchanged "
            "(the chain alone cannot show that its newest events were cut off).",
        )
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        anchor = _parse_anchor(options["anchor"]) if options["anchor"] else None
        result = AuditEvent.objects.using(options["database"]).verify()
        if not result.ok:
            raise CommandError(result.summary())
        if anchor is not None:
            sequence, expected_hash = anchor
            stored = (
                AuditEvent.objects.using(options["database"])
                .filter(sequence=sequence)
                .values_list("hash", flat=True)
                .first()
            )
            if stored is None:
                raise CommandError(
                    f"audit chain BROKEN at event {sequence}: the anchored event is missing "
                    f"(the newest event is {result.head_sequence})"
                )
            if stored != expected_hash:
                raise CommandError(
                    f"audit chain BROKEN at event {sequence}: its hash is not the anchored one "
                    "(the log was rewritten from there on)"
                )
        self.stdout.write(result.summary())
        if result.head_sequence is not None:
            self.stdout.write(f"head: {result.head_sequence}:{result.head_hash}")
