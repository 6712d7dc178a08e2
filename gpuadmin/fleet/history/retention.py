"""Keeping history bounded: 5-minute and 30-minute rollups of the raw samples, and pruning.

Raw ``GpuSample`` / ``HostSample`` rows (written when a figure moves, ``record.py``) are summarised into
``GpuRollup`` / ``HostRollup`` rows, one per GPU (host) per 5-minute bucket,
with the bucket's min, mean and max; those, once a half hour of them is closed,
into ``GpuRollupCoarse`` / ``HostRollupCoarse`` rows, one per 30-minute bucket
(the coarse tier of a round-robin store: ``roll_up_coarse``). Raw rows are kept
``GPUADMIN_HISTORY_RAW_DAYS``, and only once rolled up; 5-minute rollups
``GPUADMIN_HISTORY_FINE_DAYS``, and only once rolled up into the coarse tier;
30-minute rollups, process histories and resolved findings ``GPUADMIN_HISTORY_DAYS``.

On PostgreSQL the history tables are partitioned by day (``partitions.py``):
``maintain_history`` creates the coming days' partitions and drops a past day's
whole once all of it is past keeping, before the delete path prunes the rest (on
SQLite, everything).

``maintain_history`` (the periodic task ``gpuadmin.fleet.maintain_history``)
does both in bounded steps, each in its own short transaction, and never takes
the host row lock that ingest holds: a long catch-up cannot stall snapshots.
Each host remembers how far it is rolled up (``Host.history_rolled_up_until``,
and ``Host.history_coarse_rolled_up_until`` for the coarse tier).
Buckets before that are closed: a late snapshot taken in one is not stored
(``ingest``), because its bucket's raw rows may be pruned already and rolling
it up again would summarise the late sample alone. Hosts at the same mark (a
fleet's, once caught up) are rolled up together, a batch a transaction; a batch
that fails is tried again a host at a time, so one host's data can never stop
the others' history.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, TypeVar

from django.conf import settings
from django.db import models, transaction
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models import Min, Q, Sum
from django.utils import timezone

from gpuadmin.fleet.history import partitions, record
from gpuadmin.fleet.models import (
    Finding,
    GpuRollup,
    GpuRollupCoarse,
    GpuSample,
    Host,
    HostRollup,
    HostRollupCoarse,
    HostSample,
    ProcessLife,
    ProcessPoint,
    SnapshotRejection,
)
from gpuadmin.fleet.storage.statements import RowInsert

logger = logging.getLogger(__name__)

BUCKET_SECONDS = 300
# The coarse tier: six 5-minute buckets (partitions.COARSE_BUCKET_SECONDS, which must agree).
COARSE_BUCKET_SECONDS = 1800
FINE_PER_COARSE = COARSE_BUCKET_SECONDS // BUCKET_SECONDS
# A bucket is rolled up once this long has passed after its end: snapshots are
# stamped by the host and reach central a little later.
SETTLE_SECONDS = 60
# At most this many buckets per host per run (one day): a central that was down for a week
# catches up over a few runs instead of in one long one.
MAX_BUCKETS_PER_HOST_PER_RUN = 288
MAX_COARSE_BUCKETS_PER_HOST_PER_RUN = 48
# Hosts rolled up together (as many GPUs' rows, 8 each, in one read and one upsert).
HOSTS_PER_ROLL_UP_BATCH = 250
# Rows deleted per statement, and statements per kind per run.
PRUNE_BATCH_ROWS = 5000
PRUNE_MAX_BATCHES = 20

GPU_ROLLUP_FIELDS = [
    "sample_count",
    "memory_used_min_mib",
    "memory_used_mean_mib",
    "memory_used_max_mib",
    "memory_attributed_min_mib",
    "memory_attributed_mean_mib",
    "memory_attributed_max_mib",
    "utilization_min_percent",
    "utilization_mean_tenths_percent",
    "utilization_max_percent",
    "temperature_mean_celsius",
    "temperature_max_celsius",
    "power_draw_mean_milliwatts",
    "power_draw_max_milliwatts",
    "power_limit_max_milliwatts",
]
MiB = 1024**2
HOST_ROLLUP_FIELDS = [
    "sample_count",
    "zombies_min",
    "zombies_mean",
    "zombies_max",
    "d_state_min",
    "d_state_mean",
    "d_state_max",
    "pids_in_use_min",
    "pids_in_use_mean",
    "pids_in_use_max",
    "pid_max",
]


def _integer_column_bounds(
    model: type[models.Model], field_names: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """The (lowest, highest) value each integer column among ``field_names`` holds.

    Django's declared range for the field's type, not the connection's: SQLite stores any
    64-bit value, and a rollup must read the same on SQLite as on PostgreSQL.
    """
    ranges = BaseDatabaseOperations.integer_field_ranges
    types = {f.name: f.get_internal_type() for f in model._meta.concrete_fields if f.name in field_names}
    return {name: ranges[kind] for name, kind in types.items() if kind in ranges}


_GPU_ROLLUP_BOUNDS = _integer_column_bounds(GpuRollup, GPU_ROLLUP_FIELDS)
_HOST_ROLLUP_BOUNDS = _integer_column_bounds(HostRollup, HOST_ROLLUP_FIELDS)


def _clamp_to_columns(rollup: models.Model, bounds: dict[str, tuple[int, int]]) -> None:
    """Set each value that would not fit its column to the column's nearest bound.

    A host signs whatever it likes (the schema allows 2**63-1 bytes of GPU memory): a claim
    beyond any real GPU, such as 2 PiB, is nonsense, and a clamped value still reads as
    "very large" on the charts, where an out-of-range one would fail the whole row.
    """
    for name, (lowest, highest) in bounds.items():
        value = getattr(rollup, name)
        if value is not None:
            setattr(rollup, name, min(max(value, lowest), highest))


def bucket_of(moment: datetime) -> int:
    """The 5-minute bucket a moment falls in: Unix seconds // 300."""
    return int(moment.timestamp()) // BUCKET_SECONDS


def bucket_start(bucket: int) -> datetime:
    return datetime.fromtimestamp(bucket * BUCKET_SECONDS, tz=UTC)


@dataclass(frozen=True)
class Summary:
    minimum: int | None
    mean: float | None
    maximum: int | None


def summarise(values: Iterable[int | None], holds: Sequence[int] | None = None) -> Summary:
    """Min, mean and max of the values that are known (None when none is). ``holds``: how long each
    value held (``sample_holds``): the mean is then over time, each value weighing as long as it held
    (the plain mean of the values when none held at all)."""
    if holds is None:
        known = [v for v in values if v is not None]
        if not known:
            return Summary(None, None, None)
        return Summary(min(known), sum(known) / len(known), max(known))
    pairs = [(v, hold) for v, hold in zip(values, holds, strict=True) if v is not None]
    if not pairs:
        return Summary(None, None, None)
    known = [v for v, _ in pairs]
    held = sum(hold for _, hold in pairs)
    # Integers throughout (microseconds), divided once: evenly spaced samples give the plain mean exactly.
    mean = sum(v * hold for v, hold in pairs) / held if held else sum(known) / len(known)
    return Summary(min(known), mean, max(known))


def longest_hold() -> timedelta:
    """The longest a raw sample holds: a heartbeat and a probe interval, past which its host would have
    written another had it been up."""
    return record.raw_heartbeat() + timedelta(seconds=settings.GPUADMIN_PROBE_INTERVAL_SECONDS)


def sample_holds(moments: Sequence[datetime], bucket: int) -> list[int]:
    """How long each raw sample of one GPU (or host) in ``bucket`` held, in microseconds; ``moments``:
    their taken_at, oldest first.

    Raw samples are written when a figure moves past its step, or at the heartbeat
    (``history/record.py``): each holds until the next one, so the mean of a bucket is over time, not
    over samples (a plain mean would weigh a burst of changes as much as the minutes of calm around
    them). The last holds until the bucket ends; none holds longer than a heartbeat and a probe
    interval, past which its host would have written another had it been up (a gap counts for
    nothing). The first holds from its own moment: the bucket's start before it belongs to the
    previous bucket's last sample, which this bucket's rows do not have, and counts for nothing.
    """
    limit = _microseconds(longest_hold())
    ends = [*moments[1:], bucket_start(bucket + 1)]
    return [min(limit, _microseconds(end - moment)) for moment, end in zip(moments, ends, strict=True)]


def _microseconds(span: timedelta) -> int:
    return max(0, (span.days * 86400 + span.seconds) * 1_000_000 + span.microseconds)


@dataclass(frozen=True)
class KnownSummary:
    minimum: int
    mean: float
    maximum: int


def _known(summary: Summary) -> KnownSummary:
    assert summary.minimum is not None and summary.mean is not None and summary.maximum is not None
    return KnownSummary(summary.minimum, summary.mean, summary.maximum)


def _mib(memory: Summary) -> tuple[int | None, int | None, int | None]:
    """(min, mean, max) in MiB: the min rounded down, the max up, so no peak is ever hidden."""
    if memory.minimum is None or memory.mean is None or memory.maximum is None:
        return None, None, None
    return memory.minimum // MiB, round(memory.mean / MiB), -(-memory.maximum // MiB)


def _rounded(value: float | None) -> int | None:
    return None if value is None else round(value)


def gpu_rollups(rows: Iterable[Sequence[Any]]) -> list[GpuRollup]:
    """Rollups of raw GPU rows (``GPU_RAW_FIELDS``: gpu_id, taken_at, used, attributed, utilization,
    temperature, power draw, power limit), per GPU and bucket."""
    grouped: dict[tuple[int, int], list[Sequence[Any]]] = defaultdict(list)
    for row in rows:
        grouped[(row[0], bucket_of(row[1]))].append(row)
    rollups = []
    for (gpu_id, bucket), members in grouped.items():
        members.sort(key=itemgetter(1))  # by taken_at
        holds = sample_holds([r[1] for r in members], bucket)
        used_min, used_mean, used_max = _mib(summarise((r[2] for r in members), holds))
        attributed_min, attributed_mean, attributed_max = _mib(summarise((r[3] for r in members), holds))
        utilization = summarise((r[4] for r in members), holds)
        mean_tenths = None if utilization.mean is None else round(utilization.mean * 10)
        temperature = summarise((r[5] for r in members), holds)
        power_draw = summarise((r[6] for r in members), holds)
        rollup = GpuRollup(
            gpu_id=gpu_id,
            bucket=bucket,
            sample_count=len(members),
            memory_used_min_mib=used_min,
            memory_used_mean_mib=used_mean,
            memory_used_max_mib=used_max,
            memory_attributed_min_mib=attributed_min or 0,
            memory_attributed_mean_mib=attributed_mean or 0,
            memory_attributed_max_mib=attributed_max or 0,
            utilization_min_percent=utilization.minimum,
            utilization_mean_tenths_percent=mean_tenths,
            utilization_max_percent=utilization.maximum,
            temperature_mean_celsius=_rounded(temperature.mean),
            temperature_max_celsius=temperature.maximum,
            power_draw_mean_milliwatts=_rounded(power_draw.mean),
            power_draw_max_milliwatts=power_draw.maximum,
            power_limit_max_milliwatts=summarise(r[7] for r in members).maximum,
        )
        _clamp_to_columns(rollup, _GPU_ROLLUP_BOUNDS)
        rollups.append(rollup)
    return rollups


def host_rollups(rows: Iterable[Sequence[Any]]) -> list[HostRollup]:
    """Rollups of raw host rows ``(host_id, taken_at, zombies, d_state, pids_in_use, pid_max)``."""
    grouped: dict[tuple[int, int], list[Sequence[Any]]] = defaultdict(list)
    for row in rows:
        grouped[(row[0], bucket_of(row[1]))].append(row)
    rollups = []
    for (host_id, bucket), members in grouped.items():
        members.sort(key=itemgetter(1))  # by taken_at
        holds = sample_holds([r[1] for r in members], bucket)
        # Host counts are never null: each summary has all three values.
        zombies = _known(summarise((r[2] for r in members), holds))
        d_state = _known(summarise((r[3] for r in members), holds))
        pids = _known(summarise((r[4] for r in members), holds))
        rollup = HostRollup(
            host_id=host_id,
            bucket=bucket,
            sample_count=len(members),
            zombies_min=zombies.minimum,
            zombies_mean=zombies.mean,
            zombies_max=zombies.maximum,
            d_state_min=d_state.minimum,
            d_state_mean=d_state.mean,
            d_state_max=d_state.maximum,
            pids_in_use_min=pids.minimum,
            pids_in_use_mean=pids.mean,
            pids_in_use_max=pids.maximum,
            pid_max=max(r[5] for r in members),
        )
        _clamp_to_columns(rollup, _HOST_ROLLUP_BOUNDS)
        rollups.append(rollup)
    return rollups


GPU_RAW_FIELDS = ("gpu_id", "taken_at", "memory_used_bytes", "memory_attributed_bytes", "utilization_percent",
                  "temperature_celsius", "power_draw_milliwatts", "power_limit_milliwatts")
HOST_RAW_FIELDS = ("host_id", "taken_at", "zombie_count", "uninterruptible_count", "pids_in_use", "pid_max")


def _rollup_upsert(model: type[models.Model], fields: Sequence[str]) -> RowInsert:
    owner = "gpu" if "gpu" in {f.name for f in model._meta.concrete_fields} else "host"
    return RowInsert(model, [owner, "bucket", *fields], conflict=[owner, "bucket"], update=fields)


_GPU_ROLLUP_UPSERT = _rollup_upsert(GpuRollup, GPU_ROLLUP_FIELDS)
_HOST_ROLLUP_UPSERT = _rollup_upsert(HostRollup, HOST_ROLLUP_FIELDS)
_GPU_COARSE_UPSERT = _rollup_upsert(GpuRollupCoarse, ["fine_bucket_count", *GPU_ROLLUP_FIELDS])
_HOST_COARSE_UPSERT = _rollup_upsert(HostRollupCoarse, ["fine_bucket_count", *HOST_ROLLUP_FIELDS])


def _upsert(statement: RowInsert, rollups: Sequence[models.Model]) -> None:
    """Write ``rollups`` (one model's) through ``statement``, a row replacing the one of its bucket."""
    values = [[getattr(rollup, field.attname) for field in statement.fields] for rollup in rollups]
    statement.run(values, returning=False)


def roll_up_hosts(host_ids: Sequence[int], start: datetime, end: datetime) -> int:
    """Upsert the rollups of the hosts' raw samples taken in [start, end); return how many host buckets."""
    gpu_rows = GpuSample.objects.filter(
        gpu__host_id__in=host_ids, taken_at__gte=start, taken_at__lt=end
    ).values_list(*GPU_RAW_FIELDS)
    host_rows = HostSample.objects.filter(
        host_id__in=host_ids, taken_at__gte=start, taken_at__lt=end
    ).values_list(*HOST_RAW_FIELDS)
    hosts = host_rollups(host_rows)
    _upsert(_GPU_ROLLUP_UPSERT, gpu_rollups(gpu_rows))
    _upsert(_HOST_ROLLUP_UPSERT, hosts)
    return len(hosts)


@dataclass(frozen=True)
class _Span:
    """A stretch of buckets some hosts roll up alike: from the mark they share (None: never rolled up,
    then ``start`` is their first sample's bucket) up to ``end``, where the mark moves."""

    stored: datetime | None
    start: datetime
    end: datetime


_Item = TypeVar("_Item")


def _in_batches(items: Sequence[_Item], size: int) -> Iterator[list[_Item]]:
    for first in range(0, len(items), size):
        yield list(items[first:first + size])


def _roll_up_batch(
    hosts: list[tuple[int, str]],
    span: _Span,
    roll: Callable[[Sequence[int], datetime, datetime], int],
    mark: str,
    failure: str,
) -> int:
    """Roll ``hosts`` (pk, name) up over ``span`` with ``roll`` in one transaction and move their
    ``mark`` to its end; return what ``roll`` wrote.

    A host signs whatever it likes, so whatever its data makes fail must stop only its own history: a
    batch that fails is rolled back and tried again a host at a time, and the one that fails alone is
    tried again next run while the other hosts go on.
    """
    try:
        with transaction.atomic():
            # The batch's hosts locked first, in the order every multi-host writer takes them: the rollups'
            # inserts (their foreign keys lock each host) and the marks' UPDATE reach them in any order.
            Host.objects.lock_in_id_order([pk for pk, _ in hosts])
            written = roll([pk for pk, _ in hosts], span.start, span.end) if span.end > span.start else 0
            # Only if no other run moved it meanwhile (a run held behind a slow worker may overlap the next).
            unchanged = Q(**{f"{mark}__isnull": True}) if span.stored is None else Q(**{mark: span.stored})
            Host.objects.filter(unchanged, pk__in=[pk for pk, _ in hosts]).update(**{mark: span.end})
            return written
    except Exception:
        if len(hosts) > 1:
            return sum(_roll_up_batch([host], span, roll, mark, failure) for host in hosts)
        logger.exception(failure, hosts[0][1])
        return 0


def _roll_up_spans(
    spans: dict[_Span, list[tuple[int, str]]],
    roll: Callable[[Sequence[int], datetime, datetime], int],
    mark: str,
    failure: str,
    hosts_per_batch: int,
) -> int:
    return sum(
        _roll_up_batch(batch, span, roll, mark, failure)
        for span, hosts in spans.items()
        for batch in _in_batches(hosts, hosts_per_batch)
    )


def _firsts(model: type[models.Model], owner: str, value: str, host_ids: Sequence[int],
            hosts_per_batch: int) -> dict[int, Any]:
    """Each host's least ``value`` among its ``model`` rows (``owner``: the lookup to the host's pk);
    hosts with none are left out."""
    firsts: dict[int, Any] = {}
    for batch in _in_batches(host_ids, hosts_per_batch):
        rows = (model._default_manager.filter(**{f"{owner}__in": batch}).values(owner)
                .annotate(first=Min(value)).values_list(owner, "first"))
        for host_id, least in rows:
            firsts[host_id] = least if host_id not in firsts else min(firsts[host_id], least)
    return firsts


def roll_up(now: datetime, *, max_buckets: int = MAX_BUCKETS_PER_HOST_PER_RUN,
            hosts_per_batch: int = HOSTS_PER_ROLL_UP_BATCH) -> int:
    """Roll up every host's complete buckets, at most ``max_buckets`` per host; return buckets written.

    Hosts rolled up to the same mark (a fleet's, once caught up) go ``hosts_per_batch`` at a time: a
    few statements for a batch instead of for each host.
    """
    complete_before = bucket_start(bucket_of(now - timedelta(seconds=SETTLE_SECONDS)))
    marks = list(Host.objects.values_list("pk", "name", "history_rolled_up_until"))
    firsts = _firsts(HostSample, "host_id", "taken_at", [pk for pk, _, stored in marks if stored is None],
                     hosts_per_batch)
    spans: dict[_Span, list[tuple[int, str]]] = defaultdict(list)
    for host_id, name, stored in marks:
        start = stored
        if start is None:
            if host_id not in firsts:
                continue  # no sample yet
            start = bucket_start(bucket_of(firsts[host_id]))
        end = min(complete_before, start + timedelta(seconds=BUCKET_SECONDS * max_buckets))
        if end > start:
            spans[_Span(stored, start, end)].append((host_id, name))
    return _roll_up_spans(spans, roll_up_hosts, "history_rolled_up_until",
                          "history: rolling up %s failed; the other hosts go on", hosts_per_batch)


def is_rolled_up(host: Host, taken_at: datetime) -> bool:
    """Whether ``taken_at`` falls in a bucket of ``host`` that is rolled up already (closed)."""
    return host.history_rolled_up_until is not None and taken_at < host.history_rolled_up_until


def coarse_bucket_of(moment: datetime) -> int:
    """The 30-minute bucket a moment falls in: Unix seconds // 1800 (5-minute bucket // 6)."""
    return int(moment.timestamp()) // COARSE_BUCKET_SECONDS


def coarse_bucket_start(bucket: int) -> datetime:
    return datetime.fromtimestamp(bucket * COARSE_BUCKET_SECONDS, tz=UTC)


def _how_combined(name: str) -> str:
    """How six 5-minute values of column ``name`` make the 30-minute one: sum, min, mean or max."""
    if name == "sample_count":
        return "sum"
    for how in ("min", "mean", "max"):
        if f"_{how}_" in f"{name}_":
            return how
    raise ValueError(f"no rule to combine rollup column {name!r}")


def _coarse_plan(model: type[models.Model], field_names: Sequence[str]) -> list[tuple[str, str, bool]]:
    """(column, how combined, whether a mean is rounded to a whole number) for each of ``field_names``."""
    whole = {f.name: f.get_internal_type() != "FloatField" for f in model._meta.concrete_fields}
    return [(name, _how_combined(name), whole[name]) for name in field_names]


_GPU_COARSE_PLAN = _coarse_plan(GpuRollupCoarse, GPU_ROLLUP_FIELDS)
_HOST_COARSE_PLAN = _coarse_plan(HostRollupCoarse, HOST_ROLLUP_FIELDS)
_GPU_COARSE_BOUNDS = _integer_column_bounds(GpuRollupCoarse, GPU_ROLLUP_FIELDS)
_HOST_COARSE_BOUNDS = _integer_column_bounds(HostRollupCoarse, HOST_ROLLUP_FIELDS)
# Each coarse model's owner column, how its columns combine, and their bounds (coarse_rollups).
_Coarse = TypeVar("_Coarse", GpuRollupCoarse, HostRollupCoarse)
_CoarsePlan = list[tuple[str, str, bool]]
_COARSE_TIERS: dict[type[models.Model], tuple[str, _CoarsePlan, dict[str, tuple[int, int]]]] = {
    GpuRollupCoarse: ("gpu_id", _GPU_COARSE_PLAN, _GPU_COARSE_BOUNDS),
    HostRollupCoarse: ("host_id", _HOST_COARSE_PLAN, _HOST_COARSE_BOUNDS),
}


def _combined(plan: list[tuple[str, str, bool]], members: list[Sequence[Any]]) -> dict[str, Any]:
    """The 30-minute values of 5-minute rows ``members`` (values in ``plan``'s order).

    Min of the mins and max of the maxes (no peak hidden); each mean the mean of the known 5-minute
    means, each weighing the same: the mean over time, as each summarises its 5 minutes whatever its
    sample count. The mean of rounded means is within one unit of the raw samples' mean.
    """
    values: dict[str, Any] = {}
    for i, (name, how, whole) in enumerate(plan):
        known = [m[i] for m in members if m[i] is not None]
        if how == "sum":
            values[name] = sum(known)
        elif not known:
            values[name] = None
        elif how == "min":
            values[name] = min(known)
        elif how == "max":
            values[name] = max(known)
        else:
            mean = sum(known) / len(known)
            values[name] = round(mean) if whole else mean
    return values


def coarse_rollups(model: type[_Coarse], rows: Iterable[Sequence[Any]]) -> list[_Coarse]:
    """30-minute rollups of 5-minute rollup rows ``(gpu_id or host_id, bucket, *fields)``, the fields
    ``GPU_ROLLUP_FIELDS`` or ``HOST_ROLLUP_FIELDS`` as ``model`` is the GPUs' or the hosts' tier."""
    key, plan, bounds = _COARSE_TIERS[model]
    grouped: dict[tuple[int, int], list[Sequence[Any]]] = defaultdict(list)
    # In time order, whatever order the rows came in: a float mean is a sum, and a sum's last bit
    # depends on its order (the same rows give the same rollup, a host alone or in a batch).
    for row in sorted(rows, key=itemgetter(0, 1)):
        grouped[(row[0], row[1] // FINE_PER_COARSE)].append(row[2:])
    rollups = []
    for (owner_id, bucket), members in grouped.items():
        rollup = model(**{key: owner_id}, bucket=bucket, fine_bucket_count=len(members),
                       **_combined(plan, members))
        _clamp_to_columns(rollup, bounds)
        rollups.append(rollup)
    return rollups


def fine_rows(
    host_ids: Sequence[int], first: int, end: int
) -> tuple[list[Sequence[Any]], list[Sequence[Any]]]:
    """The hosts' 5-minute GPU and host rollup rows of buckets [first, end), as the coarse roll-up reads;
    each GPU row led by its GPU's host (read through the join the filter makes anyway)."""
    return (
        list(GpuRollup.objects.filter(gpu__host_id__in=host_ids, bucket__gte=first, bucket__lt=end)
             .values_list("gpu__host_id", "gpu_id", "bucket", *GPU_ROLLUP_FIELDS)),
        list(HostRollup.objects.filter(host_id__in=host_ids, bucket__gte=first, bucket__lt=end)
             .values_list("host_id", "bucket", *HOST_ROLLUP_FIELDS)),
    )


def roll_up_coarse_hosts(host_ids: Sequence[int], start: datetime, end: datetime) -> int:
    """Upsert the 30-minute rollups of the hosts' 5-minute rollups in [start, end) (whole half hours);
    return how many 30-minute host buckets (a host's half hour counts once, whatever its GPUs)."""
    gpu_rows, host_rows = fine_rows(host_ids, bucket_of(start), bucket_of(end))
    gpus = coarse_rollups(GpuRollupCoarse, [row[1:] for row in gpu_rows])
    hosts = coarse_rollups(HostRollupCoarse, host_rows)
    _upsert(_GPU_COARSE_UPSERT, gpus)
    _upsert(_HOST_COARSE_UPSERT, hosts)
    written = {(row[0], row[2] // FINE_PER_COARSE) for row in gpu_rows}  # (host, 30-minute bucket)
    return len(written | {(r.host_id, r.bucket) for r in hosts})


def roll_up_coarse(now: datetime, *, max_buckets: int = MAX_COARSE_BUCKETS_PER_HOST_PER_RUN,
                   hosts_per_batch: int = HOSTS_PER_ROLL_UP_BATCH) -> int:
    """Roll up every host's closed half hours of 5-minute rollups, at most ``max_buckets`` 30-minute
    buckets per host (a day: a central down for long catches up over runs); return buckets written.

    A half hour is closed once the 5-minute tier is rolled up past its end (``history_rolled_up_until``):
    its 5-minute rollups are final then. Nothing before ``GPUADMIN_HISTORY_DAYS`` is rolled up. Hosts
    go in batches, as in ``roll_up``.
    """
    kept_from = coarse_bucket_start(coarse_bucket_of(history_kept_since(now)))
    marks = []
    for host_id, name, fine_until, stored in Host.objects.filter(history_rolled_up_until__isnull=False) \
            .values_list("pk", "name", "history_rolled_up_until", "history_coarse_rolled_up_until"):
        closed_before = coarse_bucket_start(coarse_bucket_of(fine_until))
        if stored is None or stored < closed_before:  # else nothing closed since: no query for this host
            marks.append((host_id, name, closed_before, stored))
    never = [host_id for host_id, _, _, stored in marks if stored is None]
    firsts = _firsts(HostRollup, "host_id", "bucket", never, hosts_per_batch)
    for host_id, first in _firsts(GpuRollup, "gpu__host_id", "bucket", never, hosts_per_batch).items():
        firsts[host_id] = min(first, firsts.get(host_id, first))
    spans: dict[_Span, list[tuple[int, str]]] = defaultdict(list)
    for host_id, name, closed_before, stored in marks:
        start = stored
        if start is None:
            # None: nothing closed to roll up, and no 5-minute rollup can come before the 5-minute mark.
            start = (coarse_bucket_start(firsts[host_id] // FINE_PER_COARSE) if host_id in firsts
                     else closed_before)
        start = max(start, kept_from)
        end = min(closed_before, start + timedelta(seconds=COARSE_BUCKET_SECONDS * max_buckets))
        # A host never rolled up gets its mark even with nothing to roll up.
        if end > start or (end == start and stored is None):
            spans[_Span(stored, start, end)].append((host_id, name))
    return _roll_up_spans(spans, roll_up_coarse_hosts, "history_coarse_rolled_up_until",
                          "history: rolling up %s into 30-minute rollups failed; the other hosts go on",
                          hosts_per_batch)


def five_minute_buckets_with_samples(host: Host, first: int, end: int) -> int:
    """How many 5-minute buckets of [first, end) hold samples of ``host`` (rolled up ones only).

    From the 30-minute rollups before the host's coarse roll-up mark (their ``fine_bucket_count``,
    whole half hours: a half hour cut by ``first`` counts whole), from the 5-minute ones after it.
    """
    coarse_until = host.history_coarse_rolled_up_until
    split = first if coarse_until is None else min(max(bucket_of(coarse_until), first), end)
    fine = HostRollup.objects.filter(host=host, bucket__gte=split, bucket__lt=end).count()
    if split == first:
        return fine
    coarse = HostRollupCoarse.objects.filter(
        host=host, bucket__gte=first // FINE_PER_COARSE, bucket__lt=-(-split // FINE_PER_COARSE)
    ).aggregate(buckets=Sum("fine_bucket_count"))["buckets"]
    return fine + (coarse or 0)


@dataclass(frozen=True)
class PruneResult:
    gpu_samples: int
    host_samples: int
    gpu_rollups: int
    host_rollups: int
    gpu_rollups_coarse: int
    host_rollups_coarse: int
    process_lives: int
    process_points: int
    findings: int
    rejections: int

    @property
    def total(self) -> int:
        return sum(vars(self).values())


def _delete_in_batches(queryset: models.QuerySet, *, batch_rows: int, max_batches: int) -> int:
    """Delete what ``queryset`` selects, ``batch_rows`` at a time, each batch its own statement."""
    deleted = 0
    for _ in range(max_batches):
        keys = list(queryset.values_list("pk", flat=True)[:batch_rows])
        if not keys:
            break
        queryset.model.objects.filter(pk__in=keys).delete()
        deleted += len(keys)
        if len(keys) < batch_rows:
            break
    return deleted


def history_kept_since(now: datetime) -> datetime:
    """The oldest moment central keeps anything of: GPUADMIN_HISTORY_DAYS before ``now``."""
    return now - timedelta(days=settings.GPUADMIN_HISTORY_DAYS)


def raw_kept_since(now: datetime) -> datetime:
    """The oldest moment raw samples are kept of (once rolled up): GPUADMIN_HISTORY_RAW_DAYS before now."""
    return now - timedelta(days=settings.GPUADMIN_HISTORY_RAW_DAYS)


def fine_kept_since(now: datetime) -> datetime:
    """The oldest moment 5-minute rollups are kept of (once in the 30-minute ones):
    GPUADMIN_HISTORY_FINE_DAYS before ``now``."""
    return now - timedelta(days=settings.GPUADMIN_HISTORY_FINE_DAYS)


# A day partition of raw samples still holds rows of a host not rolled up past them (raw rows go only
# once rolled up): checked per host behind, through the (host or GPU, taken_at) index of the partition.
_HOST_SAMPLES_TO_KEEP = (
    "SELECT 1 FROM fleet_host h WHERE (h.history_rolled_up_until IS NULL OR h.history_rolled_up_until < %s) "
    "AND EXISTS (SELECT 1 FROM {partition} s WHERE s.host_id = h.id AND (h.history_rolled_up_until IS NULL "
    "OR s.taken_at >= h.history_rolled_up_until)) LIMIT 1"
)
_GPU_SAMPLES_TO_KEEP = (
    "SELECT 1 FROM fleet_host h JOIN fleet_gpu g ON g.host_id = h.id "
    "WHERE (h.history_rolled_up_until IS NULL OR h.history_rolled_up_until < %s) "
    "AND EXISTS (SELECT 1 FROM {partition} s WHERE s.gpu_id = g.id AND (h.history_rolled_up_until IS NULL "
    "OR s.taken_at >= h.history_rolled_up_until)) LIMIT 1"
)

# The same for a day partition of 5-minute rollups and the coarse tier's mark (``%s``: the partition's
# upper bound, then BUCKET_SECONDS twice; the marks are whole half hours, so the division is exact).
_HOST_ROLLUPS_TO_KEEP = (
    "SELECT 1 FROM fleet_host h WHERE (h.history_coarse_rolled_up_until IS NULL "
    "OR h.history_coarse_rolled_up_until < to_timestamp(%s * %s)) "
    "AND EXISTS (SELECT 1 FROM {partition} r WHERE r.host_id = h.id AND (h.history_coarse_rolled_up_until "
    "IS NULL OR r.bucket >= EXTRACT(EPOCH FROM h.history_coarse_rolled_up_until) / %s)) LIMIT 1"
)
_GPU_ROLLUPS_TO_KEEP = (
    "SELECT 1 FROM fleet_host h JOIN fleet_gpu g ON g.host_id = h.id "
    "WHERE (h.history_coarse_rolled_up_until IS NULL "
    "OR h.history_coarse_rolled_up_until < to_timestamp(%s * %s)) "
    "AND EXISTS (SELECT 1 FROM {partition} r WHERE r.gpu_id = g.id AND (h.history_coarse_rolled_up_until "
    "IS NULL OR r.bucket >= EXTRACT(EPOCH FROM h.history_coarse_rolled_up_until) / %s)) LIMIT 1"
)


def drop_expired_partitions(now: datetime) -> list[str]:
    """Drop the day partitions (PostgreSQL) whose rows ``prune`` would all delete; return their names."""
    raw_cutoff, fine_cutoff, cutoff = raw_kept_since(now), fine_kept_since(now), history_kept_since(now)
    drop = partitions.drop_partitions
    seconds = [BUCKET_SECONDS, BUCKET_SECONDS]
    return [
        *drop(partitions.GPU_SAMPLES, before=raw_cutoff, blocked=_GPU_SAMPLES_TO_KEEP),
        *drop(partitions.HOST_SAMPLES, before=raw_cutoff, blocked=_HOST_SAMPLES_TO_KEEP),
        # Past all keeping, whatever the coarse tier; then past the fine keep, once in the coarse tier.
        *drop(partitions.GPU_ROLLUPS, before=bucket_of(cutoff)),
        *drop(partitions.HOST_ROLLUPS, before=bucket_of(cutoff)),
        *drop(partitions.GPU_ROLLUPS, before=bucket_of(fine_cutoff), blocked=_GPU_ROLLUPS_TO_KEEP,
              params=seconds),
        *drop(partitions.HOST_ROLLUPS, before=bucket_of(fine_cutoff), blocked=_HOST_ROLLUPS_TO_KEEP,
              params=seconds),
        *drop(partitions.GPU_ROLLUPS_COARSE, before=coarse_bucket_of(cutoff)),
        *drop(partitions.HOST_ROLLUPS_COARSE, before=coarse_bucket_of(cutoff)),
        *drop(partitions.PROCESS_POINTS, before=cutoff),
    ]


def prune(
    now: datetime, *, batch_rows: int = PRUNE_BATCH_ROWS, max_batches: int = PRUNE_MAX_BATCHES
) -> PruneResult:
    """Delete what is past its keeping time, at most max_batches x batch_rows rows of each kind."""
    raw_cutoff = raw_kept_since(now)
    cutoff = history_kept_since(now)
    batches = {"batch_rows": batch_rows, "max_batches": max_batches}
    # Raw rows go only once rolled up, whatever their age: for the hosts rolled up past the raw keep
    # (all, normally) in one statement per batch, the others one by one.
    gpu_samples = _delete_in_batches(GpuSample.objects.filter(
        taken_at__lt=raw_cutoff, gpu__host__history_rolled_up_until__gte=raw_cutoff), **batches)
    host_samples = _delete_in_batches(HostSample.objects.filter(
        taken_at__lt=raw_cutoff, host__history_rolled_up_until__gte=raw_cutoff), **batches)
    for host_id, until in Host.objects.filter(history_rolled_up_until__lt=raw_cutoff).values_list(
        "pk", "history_rolled_up_until"
    ):
        gpu_samples += _delete_in_batches(
            GpuSample.objects.filter(gpu__host_id=host_id, taken_at__lt=until), **batches
        )
        host_samples += _delete_in_batches(
            HostSample.objects.filter(host_id=host_id, taken_at__lt=until), **batches
        )
    oldest_bucket = bucket_of(cutoff)
    gpu_rollups = _delete_in_batches(GpuRollup.objects.filter(bucket__lt=oldest_bucket), **batches)
    host_rollups = _delete_in_batches(HostRollup.objects.filter(bucket__lt=oldest_bucket), **batches)
    # 5-minute rollups go only once in the 30-minute ones, as raw rows once rolled up: for the hosts
    # rolled up past the fine keep (all, normally) in one statement per batch, the others one by one.
    fine_cutoff = bucket_of(fine_kept_since(now))
    caught_up = bucket_start(fine_cutoff)
    gpu_rollups += _delete_in_batches(GpuRollup.objects.filter(
        bucket__lt=fine_cutoff, gpu__host__history_coarse_rolled_up_until__gte=caught_up), **batches)
    host_rollups += _delete_in_batches(HostRollup.objects.filter(
        bucket__lt=fine_cutoff, host__history_coarse_rolled_up_until__gte=caught_up), **batches)
    behind = Host.objects.filter(history_coarse_rolled_up_until__lt=caught_up).values_list(
        "pk", "history_coarse_rolled_up_until")
    for host_id, coarse_until in behind:
        keep_from = bucket_of(coarse_until)
        gpu_rollups += _delete_in_batches(
            GpuRollup.objects.filter(gpu__host_id=host_id, bucket__lt=keep_from), **batches)
        host_rollups += _delete_in_batches(
            HostRollup.objects.filter(host_id=host_id, bucket__lt=keep_from), **batches)
    oldest_coarse = coarse_bucket_of(cutoff)
    return PruneResult(
        gpu_samples=gpu_samples,
        host_samples=host_samples,
        gpu_rollups=gpu_rollups,
        host_rollups=host_rollups,
        gpu_rollups_coarse=_delete_in_batches(GpuRollupCoarse.objects.filter(bucket__lt=oldest_coarse),
                                              **batches),
        host_rollups_coarse=_delete_in_batches(HostRollupCoarse.objects.filter(bucket__lt=oldest_coarse),
                                               **batches),
        process_points=_delete_in_batches(ProcessPoint.objects.filter(taken_at__lt=cutoff), **batches),
        process_lives=_delete_in_batches(ProcessLife.objects.filter(gone_at__lt=cutoff), **batches),
        findings=_delete_in_batches(Finding.objects.filter(resolved_at__lt=cutoff), **batches),
        rejections=_delete_in_batches(SnapshotRejection.objects.filter(received_at__lt=cutoff), **batches),
    )


@dataclass(frozen=True)
class MaintenanceResult:
    buckets_rolled_up: int
    pruned: PruneResult
    partitions_created: int = 0
    partitions_dropped: tuple[str, ...] = ()
    coarse_buckets_rolled_up: int = 0


def maintain_history(now: datetime | None = None) -> MaintenanceResult:
    """One run of the periodic task: roll up what is complete (5-minute buckets, then the half hours
    they close), then prune what is past keeping.

    Pruning runs even when some host's roll-up failed (``roll_up`` logs it): that host keeps
    the raw rows it has not rolled up, as raw rows go only once rolled up; the rest is pruned.
    """
    now = now or timezone.now()
    created = partitions.ensure_partitions(now)
    buckets = roll_up(now)
    coarse = roll_up_coarse(now)
    dropped = tuple(drop_expired_partitions(now))
    pruned = prune(now)
    if buckets or coarse or pruned.total or created or dropped:
        logger.info("history: %d buckets rolled up, %d into 30-minute ones, %d rows pruned (%s), "
                    "%d partitions created, dropped: %s",
                    buckets, coarse, pruned.total, pruned, created, ", ".join(dropped) or "none")
    return MaintenanceResult(buckets_rolled_up=buckets, pruned=pruned, partitions_created=created,
                             partitions_dropped=dropped, coarse_buckets_rolled_up=coarse)
