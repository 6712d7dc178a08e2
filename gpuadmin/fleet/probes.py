"""Central's side of probing: which hosts are due a probe, and "probe now".

Every probe leaves through ``gpuadmin.agent.probing.request_probe`` (by name,
to the host's own queue, expiring after one interval). What central adds is
the bookkeeping: ``Host.last_probe_sent_at``, so that hosts offline for long
are asked less often.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from gpuadmin.agent.probing import probe_expiry_seconds, request_probe
from gpuadmin.fleet.models import Host

# A host offline this long is probably down or gone: probe it once a minute only.
LONG_OFFLINE_AFTER = timedelta(hours=1)
LONG_OFFLINE_PROBE_EVERY = timedelta(minutes=1)


def probe_now(host_name: str, *, now: datetime | None = None) -> None:
    """Probe one host now (the host page's "probe now"); dropped if its agent does not take it in time."""
    request_probe(host_name)
    Host.objects.filter(name=host_name).update(last_probe_sent_at=now or timezone.now())


def send_due_probes(now: datetime | None = None) -> list[str]:
    """Send a probe to every known host that is due one; return their names.

    Hosts awaiting acceptance get none: anyone can make up their names, and
    accepting one asks it for a snapshot at once (``fleet.trust``).

    Every host is due each interval, except hosts offline for more than
    LONG_OFFLINE_AFTER, which are due once per LONG_OFFLINE_PROBE_EVERY (their
    probes still expire, so an agent that comes back runs at most one).
    """
    now = now or timezone.now()
    due = [
        (host.pk, host.name)
        for host in Host.objects.fleet().only(
            "pk", "name", "last_seen_at", "first_seen_at", "last_probe_sent_at"
        )
        if _probe_due(host, now)
    ]
    for _, name in due:
        request_probe(name)
    if due:
        Host.objects.filter(pk__in=[pk for pk, _ in due]).update(last_probe_sent_at=now)
    return [name for _, name in due]


def _probe_due(host: Host, now: datetime) -> bool:
    last_heard_at = host.last_seen_at or host.first_seen_at
    if now - last_heard_at <= LONG_OFFLINE_AFTER:
        return True
    if host.last_probe_sent_at is None:
        return True
    # A little slack: beat's ticks are not exactly one interval apart.
    slack = timedelta(seconds=probe_expiry_seconds() / 2)
    return now - host.last_probe_sent_at >= LONG_OFFLINE_PROBE_EVERY - slack
