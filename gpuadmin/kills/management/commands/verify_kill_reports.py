"""python manage.py verify_kill_reports

Verifies every kept kill report again (``gpuadmin.kills.signed_reports``): the
host's signature over the kept text, a key the audit log shows accepted for
that host, and the step's columns against what was signed. Exits 0 and prints
"kill reports OK: N verified", or exits 1 naming each step that fails. Steps
without a kept report are counted and named, not failed: they cannot be told
from steps stored before reports were kept.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gpuadmin.kills import signed_reports
from gpuadmin.kills.models import KillStep


class Command(BaseCommand):
    help = "Verify every kept kill report's signature again and compare the stored steps with it."

    def handle(self, *args: Any, **options: Any) -> None:
        findings = list(signed_reports.check_all())
        not_kept = [f for f in findings if f.problem == signed_reports.NOT_KEPT]
        failed = [f for f in findings if f.problem != signed_reports.NOT_KEPT]
        verified = KillStep.objects.count() - len(findings)
        lines = [str(f) for f in failed]
        if not_kept:
            lines.append(f"{len(not_kept)} steps have no kept report and cannot be verified (first: "
                         f"request #{not_kept[0].step.request_id} step {not_kept[0].step.seq})")
        if failed:
            raise CommandError("\n".join([f"kill reports FAILED: {len(failed)} do not verify", *lines]))
        self.stdout.write(f"kill reports OK: {verified} verified")
        for line in lines:
            self.stdout.write(line)
