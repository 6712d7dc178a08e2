"""Central's side of probing: "probe now".

Each agent probes on its own clock (``gpuadmin.agent.probing.ProbeClock``); central asks only for
more: "probe now" here, a full snapshot when it could not apply an update, and a host just
accepted. Every ask leaves through ``gpuadmin.sending.request_probe``: by name, to the host's own
queue, expiring after one interval.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.sending import request_probe


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
        probe_now_sent_at=now
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
