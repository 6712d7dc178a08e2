"""History as chart series: what the charts and the JSON API read.

A range names how far back a chart looks and at what resolution:

- ``1h``: the raw samples (written when a figure moved past its step, at least every
  ``GPUADMIN_HISTORY_RAW_SECONDS``: each holds until the next), and for an online host
  a last point at its latest snapshot, from the rows' current figures, so that a
  steady GPU's line reaches "now";
- ``24h``: the 5-minute rollups (``retention.py``), one per point;
- ``7d``, ``30d``: the 30-minute rollups (the coarse tier, kept longest), grouped
  in SQL into 30-minute and 2-hour points, so that a chart never gets more than a
  few hundred points per GPU. Memory and host counts are then the group's
  maximum (a spike stays visible), utilization the mean of its 5-minute means
  (a 30-minute rollup's weighs as the 5-minute ones it summarises), temperature
  and power (draw and limit) the group's maximum. What is not in the tier read
  yet is summarised the same way on the fly: 5-minute rollups not yet in a
  30-minute one (the last half hour), samples not yet rolled up (the last few
  minutes, or all of them before the first rollup run).

Times are written with ``gpuadmin.text.utc_text`` (ISO 8601, UTC, "Z"); points
run oldest first. Kill requests reach us through ``Host.kill_requests`` (the
kills app's reverse relation), so the fleet app never imports the kills app.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Aggregate, Count, F, IntegerField, Max, Q, Sum
from django.db.models.functions import Cast
from django.urls import reverse

from gpuadmin.fleet.history import retention
from gpuadmin.fleet.models import (
    Gpu,
    GpuRollup,
    GpuRollupCoarse,
    GpuSample,
    Host,
    HostRollup,
    HostRollupCoarse,
    HostSample,
    ProcessLife,
)
from gpuadmin.text import utc_text


@dataclass(frozen=True)
class Range:
    name: str
    seconds: int
    # None: raw samples; else how many 5-minute buckets make one point.
    buckets_per_point: int | None
    # Read from the 30-minute rollups (buckets_per_point then a multiple of retention.FINE_PER_COARSE).
    coarse: bool = False


RANGES: dict[str, Range] = {
    r.name: r
    for r in (
        Range("1h", 3600, None),
        Range("24h", 24 * 3600, 1),
        Range("7d", 7 * 24 * 3600, 6, coarse=True),
        Range("30d", 30 * 24 * 3600, 24, coarse=True),
    )
}
DEFAULT_RANGE = "24h"
# Rollups: memory and host counts are the maximum (a spike stays visible), utilization the mean.
ROLLUP_AGGREGATION = {"memory": "max", "utilization": "mean", "health": "max", "host_counts": "max"}
# A process that changes all the time still gets a bounded series: its newest points.
PROCESS_POINTS_MAX = 10_000
KILL_MARKERS_MAX = 500


class UnknownRange(ValueError):
    def __init__(self, given: str) -> None:
        super().__init__(f"range must be one of {', '.join(RANGES)}; got {given!r}")
        self.allowed = list(RANGES)


def parse_range(given: str | None) -> Range:
    if given is None or given == "":
        return RANGES[DEFAULT_RANGE]
    try:
        return RANGES[given]
    except KeyError:
        raise UnknownRange(given) from None


def host_history(host: Host, chart_range: Range, now: datetime) -> dict[str, Any]:
    """The history API's payload for one host over ``chart_range`` ending at ``now``."""
    since = now - timedelta(seconds=chart_range.seconds)
    gpus = list(host.gpus.filter(present=True).order_by("index"))
    if chart_range.buckets_per_point is None:
        resolution = int(settings.GPUADMIN_PROBE_INTERVAL_SECONDS)
        gpu_points, host_points = _raw_points(host, gpus, since)
        if host.last_seen_at is not None and now - host.last_seen_at <= Host.offline_after():
            _close_at_latest(host, gpus, gpu_points, host_points)
        aggregation = None
    else:
        resolution = retention.BUCKET_SECONDS * chart_range.buckets_per_point
        gpu_points, host_points = _rolled_up_points(host, gpus, since, chart_range.buckets_per_point,
                                                    coarse=chart_range.coarse)
        aggregation = ROLLUP_AGGREGATION
    return {
        "range": chart_range.name,
        "resolution_seconds": resolution,
        "aggregation": aggregation,
        "from": utc_text(since),
        "to": utc_text(now),
        "gpus": [
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "name": gpu.name,
                "memory_total_bytes": gpu.memory_total_bytes,
                "points": gpu_points.get(gpu.pk, []),
            }
            for gpu in gpus
        ],
        "host": {"name": host.name, "points": host_points},
        "kill_requests": kill_markers(host, since=since),
    }


def _raw_points(
    host: Host, gpus: list[Gpu], since: datetime
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    texts = _TimeTexts()
    gpu_points: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for gpu_id, taken_at, used, attributed, utilization, *health in (
        GpuSample.objects.filter(gpu__in=gpus, taken_at__gte=since)
        .order_by("taken_at")
        .values_list(*retention.GPU_RAW_FIELDS)
    ):
        gpu_points[gpu_id].append(_gpu_point(texts[taken_at], used, attributed, utilization, Health(*health)))
    host_points = [
        _host_point(texts[taken_at], zombies, d_state, pids, pid_max)
        for _, taken_at, zombies, d_state, pids, pid_max in HostSample.objects.filter(
            host=host, taken_at__gte=since
        )
        .order_by("taken_at")
        .values_list(*retention.HOST_RAW_FIELDS)
    ]
    return gpu_points, host_points


def _close_at_latest(host: Host, gpus: list[Gpu], gpu_points: dict[int, list[dict[str, Any]]],
                     host_points: list[dict[str, Any]]) -> None:
    """Each series of an online host ends at its latest snapshot, with the figures it showed: raw samples
    are written only when a figure moved past its step (or a minute passed), so a steady GPU's last one
    may be a minute older. Memory, utilization and PIDs in use are the rows' own (every snapshot writes
    them); temperature and power, zombies and D state the last written sample's, which is within its step
    of the latest (or equal: a step of 0)."""
    latest = host.last_snapshot_taken_at
    if latest is None:
        return
    t = utc_text(latest, timespec="seconds")
    for gpu in gpus:
        points = gpu_points[gpu.pk]
        if gpu.sampled_at is not None and gpu.sampled_at < latest and (not points or points[-1]["t"] < t):
            health = Health(gpu.sampled_temperature_celsius, gpu.sampled_power_draw_milliwatts,
                            gpu.sampled_power_limit_milliwatts)
            points.append(_gpu_point(t, gpu.memory_used_bytes, gpu.memory_attributed_bytes,
                                     gpu.utilization_percent, health))
    if (host.sampled_at is not None and host.sampled_at < latest and host.pids_in_use is not None
            and host.pid_max is not None and (not host_points or host_points[-1]["t"] < t)):
        host_points.append(_host_point(t, host.sampled_zombie_count or 0,
                                       host.sampled_uninterruptible_count or 0,
                                       host.pids_in_use, host.pid_max))


class _TimeTexts(dict[datetime, str]):
    """Each moment written once: every GPU (and the host) has a point at the same moments."""

    def __missing__(self, moment: datetime) -> str:
        text = self[moment] = utc_text(moment, timespec="seconds")
        return text


@dataclass(frozen=True)
class Health:
    """A chart point's GPU health, in the snapshot's units; None where no sample said."""

    temperature_celsius: int | None = None
    power_draw_milliwatts: int | None = None
    power_limit_milliwatts: int | None = None

    def highest(self, other: Health) -> Health:
        """Each value the higher of the two (a group's point: the hottest, the most drawn)."""
        return Health(_max(self.temperature_celsius, other.temperature_celsius),
                      _max(self.power_draw_milliwatts, other.power_draw_milliwatts),
                      _max(self.power_limit_milliwatts, other.power_limit_milliwatts))


def _gpu_point(
    t: str, used: int | None, attributed: int | None, utilization: float | None, health: Health
) -> dict[str, Any]:
    return {
        "t": t,
        "memory_used_bytes": used,
        "memory_attributed_bytes": attributed,
        "utilization_percent": None if utilization is None else round(utilization, 1),
        "temperature_celsius": health.temperature_celsius,
        "power_draw_milliwatts": health.power_draw_milliwatts,
        "power_limit_milliwatts": health.power_limit_milliwatts,
    }


def _host_point(t: str, zombies: int, d_state: int, pids_in_use: int, pid_max: int) -> dict[str, Any]:
    return {
        "t": t,
        "zombies": zombies,
        "d_state": d_state,
        "pids_in_use": pids_in_use,
        "pid_max": pid_max,
    }


@dataclass
class _Group:
    """One chart point being assembled from 5-minute summaries (stored and on-the-fly)."""

    used: int | None = None
    attributed: int | None = None
    utilization_sum: float = 0.0
    utilization_buckets: int = 0
    health: Health = Health()

    def add(
        self, used: int | None, attributed: int | None, utilization_sum: float | None, buckets: int,
        health: Health,
    ) -> None:
        self.health = self.health.highest(health)
        self.used = _max(self.used, used)
        self.attributed = _max(self.attributed, attributed)
        if utilization_sum is not None:
            self.utilization_sum += utilization_sum
            self.utilization_buckets += buckets

    @property
    def utilization(self) -> float | None:
        return self.utilization_sum / self.utilization_buckets if self.utilization_buckets else None


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


@dataclass(frozen=True)
class Tiers:
    """Which tier a host's history is read from, from some moment on, with no overlap and no hole:
    30-minute rollups of coarse buckets [``coarse_first``, ``coarse_end``), then 5-minute rollups of
    buckets [``fine_first``, ``fine_end``), then raw samples from ``raw_from`` (``fine_end``'s start, or
    ``since``)."""

    coarse_first: int
    coarse_end: int
    fine_first: int
    fine_end: int
    raw_from: datetime


def tiers(host: Host, since: datetime, *, coarse: bool, finest_at: datetime | None = None) -> Tiers:
    """Where to read ``host``'s history from ``since`` on. A rolled-up tier is read only before the host's
    mark for it (``history_coarse_rolled_up_until``, ``history_rolled_up_until``): after it, its rows are
    not written yet.

    Charts (``finest_at`` None) read the coarsest tier that is complete, each up to its mark: the
    30-minute rollups when ``coarse``, then the 5-minute ones, then raw samples. A replay that wants
    each moment as finely as it is still kept (``finest_at``: now) reads raw samples where
    ``GPUADMIN_HISTORY_RAW_DAYS`` keeps them, 5-minute rollups before that where
    ``GPUADMIN_HISTORY_FINE_DAYS`` does, and the 30-minute ones before those: a finer tier is pruned
    only before both its keep and the coarser tier's mark (``retention.prune``), so it is whole from
    the earlier of the two (from the bucket after its keep's cut-off: the cut-off moved on since the
    last prune)."""
    first = retention.bucket_of(since)
    coarse_first = first // retention.FINE_PER_COARSE
    coarse_until, rolled_until = host.history_coarse_rolled_up_until, host.history_rolled_up_until
    coarse_end = coarse_first
    if coarse and coarse_until is not None:
        coarse_end = retention.coarse_bucket_of(coarse_until)
        if finest_at is not None:
            coarse_end = min(coarse_end, retention.coarse_bucket_of(retention.fine_kept_since(finest_at)) + 1)
    fine_first = max(first, coarse_end * retention.FINE_PER_COARSE)
    fine_end = fine_first
    if rolled_until is not None:
        fine_end = retention.bucket_of(rolled_until)
        if finest_at is not None:
            fine_end = min(fine_end, retention.bucket_of(retention.raw_kept_since(finest_at)) + 1)
        fine_end = max(fine_first, fine_end)
    return Tiers(coarse_first, coarse_end, fine_first, fine_end, max(since, retention.bucket_start(fine_end)))


def _rolled_up_points(
    host: Host, gpus: list[Gpu], since: datetime, per_point: int, *, coarse: bool
) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Points of ``per_point`` 5-minute buckets each, keyed by 5-minute bucket // ``per_point``: from the
    30-minute rollups (``coarse``) up to the host's coarse mark, the 5-minute ones on to its fine mark,
    and the raw samples after it."""
    gpu_groups: dict[tuple[int, int], _Group] = defaultdict(_Group)
    host_groups: dict[int, dict[str, int]] = {}
    read = tiers(host, since, coarse=coarse)
    if coarse:
        per_coarse = per_point // retention.FINE_PER_COARSE
        _stored_groups(gpu_groups, host_groups, (GpuRollupCoarse, HostRollupCoarse), host=host, gpus=gpus,
                       first=read.coarse_first, end=read.coarse_end, per_point=per_coarse)
    _stored_groups(gpu_groups, host_groups, (GpuRollup, HostRollup), host=host, gpus=gpus,
                   first=read.fine_first, end=read.fine_end, per_point=per_point)

    # What is not rolled up yet: summarised here exactly as the rollup task would.
    tail_start = read.raw_from
    tail_gpus = retention.gpu_rollups(
        GpuSample.objects.filter(gpu__in=gpus, taken_at__gte=tail_start).values_list(
            *retention.GPU_RAW_FIELDS
        )
    )
    for rollup in tail_gpus:
        mean = rollup.utilization_mean_tenths_percent
        _add_rollup(
            gpu_groups[(rollup.gpu_id, rollup.bucket // per_point)],
            rollup.memory_used_max_mib,
            rollup.memory_attributed_max_mib,
            mean,
            0 if mean is None else 1,
            health=_rollup_health(rollup),
        )
    for host_rollup in retention.host_rollups(
        HostSample.objects.filter(host=host, taken_at__gte=tail_start).values_list(*retention.HOST_RAW_FIELDS)
    ):
        _add_host_counts(host_groups, host_rollup.bucket // per_point, {
            "zombies": host_rollup.zombies_max,
            "d_state": host_rollup.d_state_max,
            "pids_in_use": host_rollup.pids_in_use_max,
            "pid_max": host_rollup.pid_max,
        })

    point_seconds = retention.BUCKET_SECONDS * per_point
    texts = _TimeTexts()

    def _group_start(group: int) -> str:
        return texts[retention.bucket_start(group * point_seconds // retention.BUCKET_SECONDS)]

    gpu_points: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (gpu_id, group), values in sorted(gpu_groups.items(), key=lambda item: item[0][1]):
        gpu_points[gpu_id].append(
            _gpu_point(_group_start(group), values.used, values.attributed, values.utilization, values.health)
        )
    host_points = [
        _host_point(_group_start(group), **counts)
        for group, counts in sorted(host_groups.items())
    ]
    return gpu_points, host_points


def _stored_groups(
    gpu_groups: dict[tuple[int, int], _Group], host_groups: dict[int, dict[str, int]],
    tier: tuple[type[GpuRollup] | type[GpuRollupCoarse], type[HostRollup] | type[HostRollupCoarse]],
    *, host: Host, gpus: list[Gpu], first: int, end: int, per_point: int,
) -> None:
    """Add the stored rollups of buckets [first, end) of one tier, ``per_point`` of its buckets a point,
    to the groups. A 30-minute rollup's utilization weighs as the 5-minute ones it summarises."""
    if end <= first:
        return
    gpu_model, host_model = tier
    mean = "utilization_mean_tenths_percent"
    known = Q(**{f"{mean}__isnull": False})
    utilization_sum: Aggregate
    utilization_buckets: Aggregate
    if gpu_model is GpuRollupCoarse:
        # In integers: smallint x smallint stays a smallint on PostgreSQL, which a clamped mean x 6 overflows.
        utilization_sum = Sum(Cast(mean, IntegerField()) * F("fine_bucket_count"),
                              output_field=IntegerField())
        utilization_buckets = Sum("fine_bucket_count", filter=known)
    else:
        utilization_sum, utilization_buckets = Sum(mean), Count(mean)
    # Integer division groups buckets in SQL on both databases (bucket is an integer column).
    for row in (
        gpu_model.objects.filter(gpu__in=gpus, bucket__gte=first, bucket__lt=end)
        .annotate(group=F("bucket") / per_point)
        .values("gpu_id", "group")
        .annotate(
            used=Max("memory_used_max_mib"),
            attributed=Max("memory_attributed_max_mib"),
            utilization_sum=utilization_sum,
            utilization_buckets=utilization_buckets,
            temperature=Max("temperature_max_celsius"),
            power_draw=Max("power_draw_max_milliwatts"),
            power_limit=Max("power_limit_max_milliwatts"),
        )
    ):
        buckets = row["utilization_buckets"] or 0
        gpu_groups[(row["gpu_id"], row["group"])].add(
            _bytes(row["used"]), _bytes(row["attributed"]),
            None if not buckets else row["utilization_sum"] / 10, buckets,
            Health(row["temperature"], row["power_draw"], row["power_limit"]),
        )
    for row in (
        host_model.objects.filter(host=host, bucket__gte=first, bucket__lt=end)
        .annotate(group=F("bucket") / per_point)
        .values("group")
        .annotate(
            zombies=Max("zombies_max"),
            d_state=Max("d_state_max"),
            pids_in_use=Max("pids_in_use_max"),
            pid_max=Max("pid_max"),
        )
    ):
        _add_host_counts(host_groups, row["group"], {k: row[k] for k in ("zombies", "d_state", "pids_in_use",
                                                                           "pid_max")})


def _add_host_counts(host_groups: dict[int, dict[str, int]], group: int, counts: dict[str, int]) -> None:
    """A point's host counts: the highest of each (a point may mix tiers at a tier's mark)."""
    if group in host_groups:
        counts = {k: max(v, host_groups[group][k]) for k, v in counts.items()}
    host_groups[group] = counts


def _bytes(mib: int | None) -> int | None:
    return None if mib is None else mib * retention.MiB


def _rollup_health(rollup: GpuRollup) -> Health:
    return Health(rollup.temperature_max_celsius, rollup.power_draw_max_milliwatts,
                  rollup.power_limit_max_milliwatts)


def _add_rollup(
    group: _Group, used_mib: int | None, attributed_mib: int | None, mean_tenths: float | None, buckets: int,
    *, health: Health,
) -> None:
    """Rollup columns (MiB, tenths of a percent) into a chart point (bytes, percent)."""
    group.add(
        _bytes(used_mib),
        _bytes(attributed_mib),
        None if mean_tenths is None else mean_tenths / 10 * buckets,
        buckets,
        health,
    )


def kill_markers(
    host: Host, *, since: datetime | None = None, life: ProcessLife | None = None
) -> list[dict[str, Any]]:
    """Kill requests on the host (since ``since``), or against one process life: marks on the time axis.

    ``ran_at``: when central sent the order (None while it has not run), the moment a chart marks;
    ``gpu_uuids``: the GPUs its targets held memory on (a reset's GPU), the only GPU charts it marks.
    """
    requests = host.kill_requests.all()
    if since is not None:
        requests = requests.filter(requested_at__gte=since)
    if life is not None:
        requests = requests.filter(
            targets__pid=life.pid,
            targets__start_time_ticks=life.start_time_ticks,
            targets__boot_id=life.boot_id,
        )
    rows = list(reversed(list(
        requests.order_by("-requested_at")
        .values_list("pk", "status", "requested_at", "finished_at", "dispatched_at", "gpu_uuid")
        .distinct()[:KILL_MARKERS_MAX]
    )))
    touched: dict[int, set[str]] = {pk: {gpu_uuid} if gpu_uuid else set() for pk, *_, gpu_uuid in rows}
    # One query for the targets' memory, through the reverse relation (fleet imports no kills module).
    for request_id, memory in host.kill_requests.filter(pk__in=touched).values_list(
            "pk", "targets__gpu_memory_bytes"):
        touched[request_id].update(uuid for uuid, held in (memory or {}).items() if held)
    return [
        {
            "id": pk,
            "status": status,
            "t": utc_text(requested_at, timespec="seconds"),
            "ran_at": utc_text(dispatched_at, timespec="seconds"),
            "finished_at": utc_text(finished_at, timespec="seconds"),
            "gpu_uuids": sorted(touched[pk]),
            "url": reverse("kill_request_detail", args=[pk]),
        }
        for pk, status, requested_at, finished_at, dispatched_at, _ in rows
    ]


def process_points(life: ProcessLife) -> list[dict[str, Any]]:
    """The life's stored points, oldest first, ended by its last sighting."""
    newest = list(
        life.points.order_by("-taken_at").values_list("taken_at", "gpu_memory_bytes", "state")[
            :PROCESS_POINTS_MAX
        ]
    )
    points = [
        {"t": utc_text(t, timespec="seconds"), "gpu_memory_bytes": memory, "state": state}
        for t, memory, state in reversed(newest)
    ]
    seen_at = life.latest_sighting_at()
    if not newest or newest[0][0] < seen_at:
        points.append(
            {
                "t": utc_text(seen_at, timespec="seconds"),
                "gpu_memory_bytes": life.last_gpu_memory_bytes,
                "state": life.last_state,
            }
        )
    return points


def state_changes(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points at which the state letter changed (the first one included)."""
    changes: list[dict[str, Any]] = []
    for point in points:
        if not changes or changes[-1]["state"] != point["state"]:
            changes.append({"t": point["t"], "state": point["state"]})
    return changes


def process_history(life: ProcessLife) -> dict[str, Any]:
    """The process API's payload: identity, who, when, the GPU memory series and kill requests."""
    points = process_points(life)
    return {
        "host": life.host.name,
        "pid": life.pid,
        "start_time_ticks": life.start_time_ticks,
        "boot_id": life.boot_id,
        "ppid": life.ppid,
        "uid": life.uid,
        "user": life.user or None,
        "name": life.name,
        "cmdline": life.cmdline,
        "container_id": life.container_id or None,
        "first_seen_at": utc_text(life.first_seen_at),
        "last_seen_at": utc_text(life.latest_sighting_at()),
        "gone_at": utc_text(life.gone_at),
        "state": life.last_state,
        "gpu_memory_bytes": life.last_gpu_memory_bytes,
        "peak_gpu_memory_bytes": life.peak_gpu_memory_bytes,
        "points": points,
        "state_changes": state_changes(points),
        "kill_requests": kill_markers(life.host, life=life),
    }
