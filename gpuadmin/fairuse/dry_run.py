"""What a policy would have done over the last week, from stored history, so a lab can tune it.

History is read as finely as it is still kept (``series.tiers``, where charts choose theirs): raw
``GpuSample`` rows where ``GPUADMIN_HISTORY_RAW_DAYS`` keeps them (the last day), 5-minute rollups
before that where ``GPUADMIN_HISTORY_FINE_DAYS`` does (the day before), and 30-minute rollups for
the rest of the week. ``resolution`` says so on the policy's page.

Idle holders: a GPU at 0% utilisation with memory held (the rule of ``Gpu.idle_since``), run after
run. Raw samples are change-coded (``history/record.py``): one is written when a figure moves past
its step (to or from 0% and to or from no memory held always are) or a heartbeat
(``GPUADMIN_HISTORY_RAW_SECONDS``) after the last, so each sample holds until the next one, at most
``retention.longest_hold`` (after that its host was not reporting), and the newest until its host's
latest snapshot: a run lasts from its first idle sample until the sample that ended it. A rollup
bucket is idle only when it says its GPU was idle throughout: its highest utilisation 0 and its
least memory held above 0 MiB (a moment's work in it, which its mean would round away, makes it
busy); a run of such buckets lasts from the first one's start to the last one's end, so an older
run is known to its bucket. A host that stopped reporting does not end a run, as it does not clear
``Gpu.idle_since``: the run goes on with the next sample or bucket that says idle.

A run at least N minutes long would have notified each process alive on that host then and holding
GPU memory (``ProcessLife``), reminded it after the policy's wait, and filed a kill request after
the next one, had the run lasted. Orphans: a process life that outlived its launcher holding GPU
memory, from when its launcher went. Over K GPUs needs per-GPU holders at each moment, which history
does not keep: it is listed live only (an honest "not computed"). Nothing is written: it reads
history.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from gpuadmin.fairuse.models import Policy
from gpuadmin.fleet.history import retention, series
from gpuadmin.fleet.models import GpuRollup, GpuRollupCoarse, GpuSample, Host, ProcessLife
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


# A GPU's stretch of history that one sample or bucket describes: (from, to, idle throughout).
_Span = tuple[datetime, datetime, bool]


def resolution() -> str:
    """How finely the dry run sees each day of the week (the module's docstring), for its page."""
    raw_days, fine_days = settings.GPUADMIN_HISTORY_RAW_DAYS, settings.GPUADMIN_HISTORY_FINE_DAYS
    return (
        f"Read from stored history as finely as it is kept: up to {_days(raw_days)} back, raw samples "
        f"(each holds until the next); up to {_days(fine_days)} back, 5-minute buckets; before that, "
        "30-minute buckets. A bucket counts as idle only when its GPU was idle throughout it, so an older "
        "run starts and ends on a bucket's edge (to within 5 or 30 minutes)."
    )


def _days(days: int) -> str:
    return f"{days} day" if days == 1 else f"{days} days"


def _bucket_spans(
    spans: dict[tuple[int, int], list[_Span]], model: type[GpuRollup] | type[GpuRollupCoarse], host: Host,
    *, first: int, end: int,
) -> None:
    """Add each of the host's GPU rollups of buckets [first, end) of one tier, oldest first."""
    if end <= first:
        return
    coarse = model is GpuRollupCoarse
    seconds = timedelta(seconds=retention.COARSE_BUCKET_SECONDS if coarse else retention.BUCKET_SECONDS)
    bucket_start = retention.coarse_bucket_start if coarse else retention.bucket_start
    for gpu_id, index, bucket, utilization_max, attributed_min in (
        model.objects.filter(gpu__host=host, bucket__gte=first, bucket__lt=end)
        .order_by("bucket")
        .values_list("gpu_id", "gpu__index", "bucket", "utilization_max_percent", "memory_attributed_min_mib")
    ):
        begins = bucket_start(bucket)
        spans[(gpu_id, index)].append((begins, begins + seconds, utilization_max == 0 and attributed_min > 0))


def _sample_spans(spans: dict[tuple[int, int], list[_Span]], host: Host, *, since: datetime) -> None:
    """Add each of the host's raw GPU samples from ``since``, holding until the next (module docstring)."""
    longest = retention.longest_hold()
    last: dict[tuple[int, int], tuple[datetime, bool]] = {}
    for gpu_id, index, taken_at, utilization, attributed in (
        GpuSample.objects.filter(gpu__host=host, taken_at__gte=since)
        .order_by("taken_at")
        .values_list("gpu_id", "gpu__index", "taken_at", "utilization_percent", "memory_attributed_bytes")
    ):
        key = (gpu_id, index)
        if key in last:
            before, idle = last[key]
            spans[key].append((before, min(taken_at, before + longest), idle))
        last[key] = (taken_at, utilization == 0 and attributed > 0)
    latest = host.last_snapshot_taken_at
    for key, (before, idle) in last.items():
        until = before if latest is None else max(before, latest)
        spans[key].append((before, min(until, before + longest), idle))


def _idle_runs(host: Host, start: datetime, now: datetime) -> list[tuple[datetime, datetime, int]]:
    """(from, to, GPU index) of each stretch from ``start`` of a host's GPU idling with memory held."""
    read = series.tiers(host, start, coarse=True, finest_at=now)
    spans: dict[tuple[int, int], list[_Span]] = defaultdict(list)
    _bucket_spans(spans, GpuRollupCoarse, host, first=read.coarse_first, end=read.coarse_end)
    _bucket_spans(spans, GpuRollup, host, first=read.fine_first, end=read.fine_end)
    _sample_spans(spans, host, since=read.raw_from)
    runs = []
    for (_, index), gpu_spans in spans.items():
        run: tuple[datetime, datetime] | None = None
        for begins, ends, idle in gpu_spans:
            if idle:
                run = (begins, ends) if run is None else (run[0], ends)
            elif run is not None:
                runs.append((max(run[0], start), run[1], index))
                run = None
        if run is not None:
            runs.append((max(run[0], start), run[1], index))
    return runs


def would_have(policy: Policy, now: datetime) -> list[WouldHave]:
    """Each step the policy would have taken over the last week, oldest first."""
    start = now - WINDOW
    found: list[WouldHave] = []
    for host in _hosts(policy):
        lives = ProcessLife.objects.filter(host=host, peak_gpu_memory_bytes__gt=0).filter(
            Q(gone_at__isnull=True) | Q(gone_at__gte=start)
        )
        if policy.condition == Policy.Condition.IDLE_HOLDER:
            for run_from, run_to, index in _idle_runs(host, start, now):
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
