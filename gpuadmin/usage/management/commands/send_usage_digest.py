"""``manage.py send_usage_digest [--dry-run] [--week-ending YYYY-MM-DD]``: last week's usage digest."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpuadmin.usage import digest


class Command(BaseCommand):
    help = "Send (or with --dry-run print) the weekly usage digest to the approvers."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="print it and its recipients; send nothing")
        parser.add_argument("--week-ending",
                            help="the digest's last UTC day, YYYY-MM-DD (default: yesterday)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            today = (date.fromisoformat(options["week_ending"]) + timedelta(days=1)
                     if options["week_ending"] else None)
        except ValueError:
            raise CommandError("--week-ending is a day, YYYY-MM-DD") from None
        period = digest.last_week(today)
        if options["dry_run"]:
            subject, body = digest.compose(period)
            people = ", ".join(p.name for p in digest.recipients()) or "nobody (no approver has a person)"
            self.stdout.write(f"To: {people}\nSubject: {subject}\n\n{body}")
            return
        sent = [digest.deliver(message_id) for message_id in digest.queue_digest(period)]
        self.stdout.write(f"{sum(sent)} of {len(sent)} digest messages sent")
