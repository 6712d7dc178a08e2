"""python manage.py verify_audit [--anchor SEQUENCE:HASH] [--anchor-file PATH ...] [--require-anchors]

Recomputes the audit log's hash chain, then checks it against the signed
anchors kept outside the database (``GPUADMIN_AUDIT_ANCHOR_FILE``, and any
``--anchor-file``: another copy, or a saved journal or syslog). Exits 0 and
prints "audit chain OK: N events" and what the anchors say, or exits 1 naming
the first bad event, or the first anchor the table disagrees with and the
events changed after it. A forged anchor line is reported, never trusted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpuadmin.audit import anchors
from gpuadmin.audit.models import AuditEvent


def _parse_anchor(text: str) -> tuple[int, str]:
    sequence, _, hash_hex = text.partition(":")
    if not sequence.isdigit() or len(hash_hex) != 64:
        raise CommandError(f"--anchor must be SEQUENCE:HASH (64 hex digits), not {text!r}")
    return int(sequence), hash_hex.lower()


class Command(BaseCommand):
    help = "Recompute the audit log's hash chain, check it against its signed anchors, name what changed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--anchor",
            metavar="SEQUENCE:HASH",
            help="A head printed by an earlier run: also check that this event is still there, unchanged "
            "(the chain alone cannot show that its newest events were cut off).",
        )
        parser.add_argument(
            "--anchor-file", action="append", default=[], metavar="PATH",
            help="Read signed anchors from this file too (a copy of the anchor file, a saved journal or "
            "syslog); the configured GPUADMIN_AUDIT_ANCHOR_FILE is always read.",
        )
        parser.add_argument("--require-anchors", action="store_true",
                            help="Fail when no anchor vouches for the chain.")
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        anchor = _parse_anchor(options["anchor"]) if options["anchor"] else None
        using = options["database"]
        result = AuditEvent.objects.using(using).verify()
        paths = [Path(settings.GPUADMIN_AUDIT_ANCHOR_FILE), *(Path(p) for p in options["anchor_file"])]
        try:
            against = anchors.check(anchors.read(paths), using)
        except anchors.BadAnchor as error:
            raise CommandError(str(error)) from None
        if not result.ok:
            raise CommandError("\n".join([result.summary(), *against.lines]))
        if anchor is not None:
            self._check_given_anchor(anchor, result.head_sequence, using)
        if not against.ok or (options["require_anchors"] and not against.anchors):
            raise CommandError("\n".join([result.summary(), *against.lines]))
        self.stdout.write(result.summary())
        for line in against.lines:
            self.stdout.write(line)
        if result.head_sequence is not None:
            self.stdout.write(f"head: {result.head_sequence}:{result.head_hash}")

    def _check_given_anchor(self, anchor: tuple[int, str], head_sequence: int | None, using: str) -> None:
        sequence, expected_hash = anchor
        events = AuditEvent.objects.using(using)
        stored = events.filter(sequence=sequence).values_list("hash", flat=True).first()
        if stored is None:
            raise CommandError(
                f"audit chain BROKEN at event {sequence}: the anchored event is missing "
                f"(the newest event is {head_sequence})"
            )
        if stored != expected_hash:
            raise CommandError(
                f"audit chain BROKEN at event {sequence}: its hash is not the anchored one "
                "(the log was rewritten from there on)"
            )
