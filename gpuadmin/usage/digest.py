"""The weekly usage digest for approvers: GPU-hours and idle GPU-hours by person, kills that failed or
did not free memory, hosts that were offline, and what the fair-use policies did.

``compose(period)`` writes it (``manage.py send_usage_digest --dry-run`` prints it); ``queue_digest``
stores one ``DigestMessage`` per approver's destination, once per week, and ``deliver`` sends one
through ``notify.delivery`` (email and Apprise), as the notify app sends its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db.models import Count, Q
from django.utils import timezone

from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.history.retention import BUCKET_SECONDS, bucket_of, five_minute_buckets_with_samples
from gpuadmin.fleet.models import Finding, Host
from gpuadmin.kills.models import KillRequest
from gpuadmin.kills.states import Status
from gpuadmin.notify.delivery import send, shown_url
from gpuadmin.notify.models import Person
from gpuadmin.notify.services import approver_users
from gpuadmin.text import human_bytes
from gpuadmin.usage.models import DigestMessage
from gpuadmin.usage.queries import Grouping, Period, Sort, usage_table

logger = logging.getLogger(__name__)

DIGEST_DAYS = 7
# Kill results that mean the memory may still be held.
_FAILED_KILLS = (Status.FAILED, Status.UNKILLABLE, Status.REFUSED)
# A host missing fewer 5-minute history buckets than this in the week is not called offline.
OFFLINE_MIN_BUCKETS = 3


@dataclass(frozen=True)
class Section:
    title: str
    lines: list[str]


def last_week(today: date | None = None) -> Period:
    """The seven UTC days before ``today`` (today itself not yet over)."""
    today = today or timezone.now().astimezone(UTC).date()
    return Period(today - timedelta(days=DIGEST_DAYS), today - timedelta(days=1))


def _hours(value: float) -> str:
    return f"{value:.1f} h"


def usage_section(period: Period) -> Section:
    table = usage_table(period, Grouping.PERSON, Sort.HELD)
    lines = [f"{row.label}: {_hours(row.total.held_gpu_hours)} held, {_hours(row.total.idle_gpu_hours)} idle"
             for row in table.rows]
    return Section("GPU-hours and idle GPU-hours by person", lines or ["No GPU was held."])


def kills_section(period: Period) -> Section:
    lines = []
    finished = (KillRequest.objects.filter(finished_at__gte=period.start_at, finished_at__lt=period.end_at)
                .select_related("host").order_by("finished_at", "pk"))
    for kill in finished:
        if kill.status in _FAILED_KILLS:
            lines.append(f"#{kill.pk} on {kill.host.name}: {kill.get_status_display().lower()}"
                         + (f" ({kill.result_detail})" if kill.result_detail else ""))
        elif kill.memory_not_released_bytes:
            lines.append(f"#{kill.pk} on {kill.host.name}: {human_bytes(kill.memory_not_released_bytes)} "
                         "of GPU memory not released")
    flagged = (Finding.objects.filter(kind=Finding.Kind.MEMORY_NOT_RELEASED, first_seen_at__lt=period.end_at,
                                      last_seen_at__gte=period.start_at).select_related("host"))
    lines += [f"{finding.host.name}: {finding.title}" for finding in flagged]
    return Section("Kills that failed or did not free memory", lines or ["None."])


def offline_section(period: Period, now: datetime | None = None) -> Section:
    """Hosts offline now, and hosts whose history misses at least ``OFFLINE_MIN_BUCKETS`` 5-minute
    buckets of the period (no snapshot in them: agent or host down)."""
    now = now or timezone.now()
    lines = []
    offline_now = set(Host.objects.offline(now).values_list("pk", flat=True))
    for host in Host.objects.order_by("name"):
        start = max(period.start_at, host.first_seen_at)
        end = min(period.end_at, host.history_rolled_up_until or start)
        expected = max(0, bucket_of(end) - bucket_of(start)) if end > start else 0
        present = five_minute_buckets_with_samples(host, bucket_of(start), bucket_of(end)) if expected else 0
        missing = expected - present
        said = []
        if host.pk in offline_now:
            seen = host.last_seen_at.strftime("%Y-%m-%d %H:%M UTC") if host.last_seen_at else "never"
            said.append(f"offline now (last seen {seen})")
        if missing >= OFFLINE_MIN_BUCKETS:
            said.append(f"no snapshot for about {_hours(missing * BUCKET_SECONDS / 3600)} of the week")
        if said:
            lines.append(f"{host.name}: " + "; ".join(said))
    return Section("Hosts that were offline", lines or ["None."])


def policies_section(period: Period) -> Section:
    """Each live fair-use policy that acted in the period: its owners notified, reminded, and the kill
    requests it filed (each still waiting for, or decided by, an approver). Dry runs act on nobody."""
    def cases_where(moment: str) -> Count:
        return Count("cases", filter=Q(**{f"cases__{moment}__gte": period.start_at,
                                          f"cases__{moment}__lt": period.end_at}))

    policies = Policy.objects.annotate(
        notified=cases_where("notified_at"), reminded=cases_where("reminded_at"),
        requested=cases_where("kill_request__requested_at"),
    ).order_by("name")
    lines = [f"{p.name}: {p.notified} notified, {p.reminded} reminded, "
             f"{p.requested} kill request{'' if p.requested == 1 else 's'} filed"
             for p in policies if p.notified or p.reminded or p.requested]
    return Section("Fair-use policies that fired", lines or ["None."])


def compose(period: Period) -> tuple[str, str]:
    """The digest's subject and body (plain text)."""
    sections = [usage_section(period), kills_section(period), offline_section(period),
                policies_section(period)]
    subject = f"GPU usage, {period.start} to {period.end}"
    body = [f"{subject} (UTC days; busy and idle as on the usage page).", ""]
    for section in sections:
        body += [section.title, *(f"  {line}" for line in section.lines), ""]
    return subject, "\n".join(body)


def recipients() -> list[Person]:
    """Approvers with a person in the directory (the ones told about requests to approve)."""
    return list(Person.objects.filter(user__in=approver_users(), notify_requests_to_approve=True).distinct())


def queue_digest(period: Period) -> list[int]:
    """One queued message per approver's destination for ``period``, once; the new ones' ids."""
    subject, body = compose(period)
    drafts = [DigestMessage(period_start=period.start, person=person, recipient_name=person.name, url=url,
                            destination=shown_url(url), subject=subject[:300], body=body)
              for person in recipients() for url in person.apprise_urls()]
    DigestMessage.objects.bulk_create(drafts, ignore_conflicts=True)
    return list(DigestMessage.objects.filter(period_start=period.start, status=DigestMessage.Status.QUEUED)
                .values_list("pk", flat=True))


def deliver(message_id: int) -> bool:
    """Send one queued digest message (claimed first: two tasks naming it send once); whether it went."""
    claimed = DigestMessage.objects.filter(pk=message_id, status=DigestMessage.Status.QUEUED).update(
        status=DigestMessage.Status.SENDING)
    if not claimed:
        return False
    message = DigestMessage.objects.get(pk=message_id)
    outcome = send(message.url, message.subject, message.body)
    status = DigestMessage.Status.SENT if outcome.ok else DigestMessage.Status.FAILED
    DigestMessage.objects.filter(pk=message_id).update(
        status=status, last_error="" if outcome.ok else outcome.error, finished_at=timezone.now())
    if not outcome.ok:
        logger.warning("usage digest %s to %s failed: %s", message_id, message.destination, outcome.error)
    return outcome.ok
