"""The nav's count of what needs someone now, on every page: offline hosts, critical findings, requests
waiting for approval (the same three the fleet page's attention strip names).

Read lazily (``nav_attention``, a context processor): a page that never shows the nav pays nothing, one that
does pays two aggregate queries, whatever the fleet's size, at most once per poll interval and process (kept
in Django's cache: nothing it counts changes faster than snapshots arrive). The fleet page passes its
summary's figures instead (``FleetSummary.attention_count``), and keeps them for the other pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.core.cache import cache
from django.db.models import Count, Sum
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from gpuadmin.accounts.roles import Role, has_role
from gpuadmin.fleet.models import Host, awaiting_acceptance_q, online_q
from gpuadmin.htmx import poll_seconds
from gpuadmin.kills.models import KillRequest

CACHE_KEY = "gpuadmin.web.attention.count"


@dataclass(frozen=True)
class AttentionCount:
    offline_hosts: int
    critical_findings: int
    pending_approvals: int

    @property
    def total(self) -> int:
        return self.offline_hosts + self.critical_findings + self.pending_approvals

    @property
    def label(self) -> str:
        """What the number stands for, said in full (its title, and what a screen reader reads)."""
        return (f"{self.offline_hosts} offline host{'s' if self.offline_hosts != 1 else ''}, "
                f"{self.critical_findings} critical finding{'s' if self.critical_findings != 1 else ''}, "
                f"{self.pending_approvals} kill request{'s' if self.pending_approvals != 1 else ''} "
                "waiting for approval")

    @classmethod
    def of_fleet(cls, now: datetime) -> AttentionCount:
        """Two queries: the fleet's hosts (offline ones counted, their summaries' open critical findings
        summed: ``HostSummary``, one row per host), and the pending requests."""
        fleet = ~awaiting_acceptance_q()
        hosts = Host.objects.aggregate(
            offline=Count("pk", filter=fleet & ~online_q(now)),
            critical=Sum("summary__findings_critical_count", filter=fleet))
        return cls(offline_hosts=hosts["offline"], critical_findings=int(hosts["critical"] or 0),
                   pending_approvals=KillRequest.objects.pending().count())


def current_count() -> AttentionCount:
    """The count, as kept for up to a poll interval, or counted now."""
    count = cache.get(CACHE_KEY)
    if not isinstance(count, AttentionCount):
        count = keep(AttentionCount.of_fleet(timezone.now()))
    return count


def keep(count: AttentionCount) -> AttentionCount:
    """Keep ``count`` (just counted, here or by the fleet page's summary) for the next pages."""
    cache.set(CACHE_KEY, count, timeout=poll_seconds())
    return count


def nav_attention(request: HttpRequest) -> dict[str, object]:
    """``nav_attention`` for templates/base.html: only for who may see the fleet, read only if shown."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not has_role(user, Role.VIEWER):
        return {}
    return {"nav_attention": SimpleLazyObject(current_count)}
