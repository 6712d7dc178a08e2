"""What a policy would have done over the last week, from stored history, so a lab can tune it.

Idle holders: a GPU's samples (``GpuSample``) at 0% utilisation with memory held, run after run;
a run at least N minutes long would have notified each process alive on that host then and
holding GPU memory (``ProcessLife``), reminded it after the policy's wait, and filed a kill
request after the next one, had the run lasted. Orphans: a process life that outlived its
launcher holding GPU memory, from when its launcher went. Over K GPUs needs per-GPU holders
at each moment, which history does not keep: it is listed live only (an honest "not computed").
Nothing is written: it reads history.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q

from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.models import GpuSample, Host, ProcessLife
from gpuadmin.text import human_bytes

WINDOW = timedelta(days=7)


@dataclass(frozen=True)
class WouldHave:
    host_name: str
    pid: int
    who: str
    what: str
    held_bytes: int
    since: datetime
    notified_at: datetime
    reminded_at: datetime | None
    requested_at: datetime | None


def _hosts(policy: Policy) -> list[Host]:
    hosts = Host.objects.fleet()
    if policy.scope == Policy.Scope.HOSTS:
        hosts = hosts.filter(pk__in=policy.hosts.values("pk"))
    return list(hosts)


def _steps(
    policy: Policy, since: datetime, until: datetime
) -> tuple[datetime, datetime | None, datetime | None]:
    notified = since + timedelta(minutes=policy.minutes)
    reminded = notified + timedelta(minutes=policy.notify_again_after_minutes)
    requested = reminded + timedelta(minutes=policy.request_after_minutes)
    return notified, reminded if reminded <= until else None, requested if requested <= until else None


def _idle_runs(host: Host, start: datetime) -> list[tuple[datetime, datetime, int]]:
    """(from, to, GPU index) of each stretch of a host's GPU samples at 0% with memory held."""
    runs = []
    samples = (
        GpuSample.objects.filter(gpu__host=host, taken_at__gte=start)
        .order_by("gpu_id", "taken_at")
        .values_list("gpu_id", "gpu__index", "taken_at", "utilization_percent", "memory_attributed_bytes")
    )
    current: list[object] | None = None
    for gpu_id, index, taken_at, utilization, attributed in samples:
        idle = utilization == 0 and attributed > 0
        if current is not None and (current[0] != gpu_id or not idle):
            runs.append((current[1], current[2], current[3]))
            current = None
        if idle:
            if current is None:
                current = [gpu_id, taken_at, taken_at, index]
            else:
                current[2] = taken_at
    if current is not None:
        runs.append((current[1], current[2], current[3]))
    return runs  # type: ignore[return-value]


def would_have(policy: Policy, now: datetime) -> list[WouldHave]:
    """Each step the policy would have taken over the last week, oldest first."""
    start = now - WINDOW
    found: list[WouldHave] = []
    for host in _hosts(policy):
        lives = ProcessLife.objects.filter(host=host, peak_gpu_memory_bytes__gt=0).filter(
            Q(gone_at__isnull=True) | Q(gone_at__gte=start)
        )
        if policy.condition == Policy.Condition.IDLE_HOLDER:
            for run_from, run_to, index in _idle_runs(host, start):
                if run_to - run_from < timedelta(minutes=policy.minutes):
                    continue
                for life in lives.filter(first_seen_at__lte=run_to).filter(
                    Q(gone_at__isnull=True) | Q(gone_at__gte=run_from)
                ):
                    notified, reminded, requested = _steps(policy, max(run_from, life.first_seen_at), run_to)
                    found.append(
                        WouldHave(
                            host_name=host.name,
                            pid=life.pid,
                            who=life.user or str(life.uid),
                            what=(
                                f"{life.name} (pid {life.pid}) held up to "
                                f"{human_bytes(life.peak_gpu_memory_bytes)} "
                                f"while GPU {index} idled"
                            ),
                            held_bytes=life.peak_gpu_memory_bytes,
                            since=run_from,
                            notified_at=notified,
                            reminded_at=reminded,
                            requested_at=requested,
                        )
                    )
        elif policy.condition == Policy.Condition.ORPHAN_OR_ZOMBIE:
            for life in lives.filter(was_orphaned=True):
                since = life.launcher_exited_before or life.first_seen_at
                until = life.gone_at or now
                if until - since < timedelta(minutes=policy.minutes):
                    continue
                notified, reminded, requested = _steps(policy, since, until)
                found.append(
                    WouldHave(
                        host_name=host.name,
                        pid=life.pid,
                        who=life.user or str(life.uid),
                        what=f"orphan {life.name} (pid {life.pid}) held up to "
                        f"{human_bytes(life.peak_gpu_memory_bytes)}",
                        held_bytes=life.peak_gpu_memory_bytes,
                        since=since,
                        notified_at=notified,
                        reminded_at=reminded,
                        requested_at=requested,
                    )
                )
    return sorted(found, key=lambda w: (w.notified_at, w.host_name, w.pid))
