"""Central's side of probing: which hosts are due a probe, and "probe now".

Every probe leaves through ``gpuadmin.sending`` (``request_probe``, a round through
``request_probes``: by name, to the host's own queue, expiring after one interval). What
central adds is the bookkeeping: ``Host.last_probe_sent_at``, so that hosts offline for
long are asked less often; written only for them (and by "probe now"), as nothing else
reads it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.sending import probe_expiry_seconds, request_probe, request_probes

# A host offline this long is probably down or gone: probe it once a minute only.
LONG_OFFLINE_AFTER = timedelta(hours=1)
LONG_OFFLINE_PROBE_EVERY = timedelta(minutes=1)


class ProbeTooSoon(Exception):
    """A "probe now" for this host went out less than one probe interval ago."""

    def __init__(self, host_name: str, seconds_left: float) -> None:
        self.seconds_left = max(1, round(seconds_left))
        super().__init__(
            f"{host_name} was asked for a probe less than {probe_now_interval().total_seconds():.0f} s ago; "
            f"try again in {self.seconds_left} s (its regular probes go on meanwhile)"
        )


def probe_now_interval() -> timedelta:
    return timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)


def probe_now(host_name: str, *, now: datetime | None = None) -> None:
    """Probe one host now (the host page's "probe now"); dropped if its agent does not take it in time.

    At most once per probe interval per host, however many people press it, so
    the button cannot keep an agent busy: raises ProbeTooSoon otherwise. The
    slot is taken with one conditional UPDATE, so two presses at once send one.
    """
    now = now or timezone.now()
    interval = probe_now_interval()
    host = Host.objects.filter(name=host_name)
    row = host.values("probe_now_sent_at").first()
    if row is None:
        raise Host.DoesNotExist(f"no host named {host_name!r}")
    previous = row["probe_now_sent_at"]
    taken = host.filter(Q(probe_now_sent_at__isnull=True) | Q(probe_now_sent_at__lte=now - interval)).update(
        probe_now_sent_at=now, last_probe_sent_at=now
    )
    if not taken:
        sent_at = host.values_list("probe_now_sent_at", flat=True).first() or now
        raise ProbeTooSoon(host_name, (sent_at + interval - now).total_seconds())
    try:
        request_probe(host_name)
    except Exception:
        # Not sent: give the slot back so that the next press can try again.
        host.filter(probe_now_sent_at=now).update(probe_now_sent_at=previous)
        raise


def send_due_probes(now: datetime | None = None) -> list[str]:
    """Send a probe to every known host that is due one; return their names.

    Hosts awaiting acceptance get none: anyone can make up their names, and
    accepting one asks it for a snapshot at once (``fleet.intake.trust``).

    Every host is due each interval, except hosts offline for more than
    LONG_OFFLINE_AFTER, which are due once per LONG_OFFLINE_PROBE_EVERY (their
    probes still expire, so an agent that comes back runs at most one). Only
    theirs is recorded: a fleet's hosts are nearly all heard from, and writing
    each one's row every interval (10,000 at a lab's size) took their row locks
    from under ingest for nothing.
    """
    now = now or timezone.now()
    due, recorded = [], []
    hosts = Host.objects.fleet().only("pk", "name", "last_seen_at", "first_seen_at", "last_probe_sent_at")
    for host in hosts:
        long_offline = _long_offline(host, now)
        if not long_offline or _long_offline_probe_due(host, now):
            due.append(host.name)
            if long_offline:
                recorded.append(host.pk)
    request_probes(due)
    if recorded:
        Host.objects.filter(pk__in=recorded).update(last_probe_sent_at=now)
    return due


def _long_offline(host: Host, now: datetime) -> bool:
    return now - (host.last_seen_at or host.first_seen_at) > LONG_OFFLINE_AFTER


def _long_offline_probe_due(host: Host, now: datetime) -> bool:
    if host.last_probe_sent_at is None:
        return True
    # A little slack: beat's ticks are not exactly one interval apart.
    slack = timedelta(seconds=probe_expiry_seconds() / 2)
    return now - host.last_probe_sent_at >= LONG_OFFLINE_PROBE_EVERY - slack
