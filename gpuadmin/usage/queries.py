"""The usage ledger read: one query behind the page's table and chart, its CSV and the API.

``usage_table(period, by, sort)`` adds up ``UsageDay`` rows of the period by one grouping; the page
shows its rows, the CSV writes the same rows' ``cells()`` and the API their numbers, so the three
cannot disagree. ``processes_behind`` lists the process lives behind one row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db.models import Q, Sum
from django.db.models.enums import TextChoices
from django.utils import timezone

from gpuadmin.fleet.models import Host
from gpuadmin.notify.directory import Directory
from gpuadmin.usage.models import COUNTER_FIELDS, LifeUsage, UsageDay

MS_PER_HOUR = 3_600_000
BYTE_SECONDS_PER_GIB_HOUR = 2**30 * 3600
PRESET_DAYS = (7, 30)
# The longest period one answer adds up (the ledger keeps GPUADMIN_USAGE_DAYS anyway).
MAX_PERIOD_DAYS = 800


class Grouping(TextChoices):
    USER = "user", "Unix user"
    PERSON = "person", "Person"
    OWNER = "owner", "Owner (job, container, pod)"
    HOST = "host", "Host"
    GPU_MODEL = "gpu_model", "GPU model"


class Sort(TextChoices):
    HELD = "held", "GPU-hours"
    IDLE = "idle", "Idle GPU-hours"


class BadQuery(ValueError):
    """A period, grouping or sort that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Period:
    """UTC days ``start`` to ``end``, both included."""

    start: date
    end: date

    @property
    def days(self) -> list[date]:
        return [self.start + timedelta(days=n) for n in range((self.end - self.start).days + 1)]

    @property
    def start_at(self) -> datetime:
        return datetime.combine(self.start, time(0), tzinfo=UTC)

    @property
    def end_at(self) -> datetime:
        return datetime.combine(self.end + timedelta(days=1), time(0), tzinfo=UTC)


def last_days(days: int, today: date | None = None) -> Period:
    today = today or timezone.now().astimezone(UTC).date()
    return Period(today - timedelta(days=days - 1), today)


def parse_period(start: str | None, end: str | None, *, default_days: int = 7) -> Period:
    """From ``from`` and ``to`` as YYYY-MM-DD (either may be missing: the last ``default_days``)."""
    fallback = last_days(default_days)
    try:
        period = Period(date.fromisoformat(start) if start else fallback.start,
                        date.fromisoformat(end) if end else fallback.end)
    except ValueError:
        raise BadQuery("from and to are days, YYYY-MM-DD") from None
    if not start and end:
        period = Period(period.end - timedelta(days=default_days - 1), period.end)
    if period.end < period.start:
        raise BadQuery("to is before from")
    if (period.end - period.start).days >= MAX_PERIOD_DAYS:
        raise BadQuery(f"a period is at most {MAX_PERIOD_DAYS} days")
    return period


def parse_choice(kind: type[TextChoices], value: str | None, default: str, name: str) -> str:
    value = value or default
    if value not in kind.values:
        raise BadQuery(f"{name} is one of {', '.join(kind.values)}")
    return value


@dataclass
class Figures:
    """Counters added up (``COUNTER_FIELDS``), read as hours."""

    counters: list[int] = field(default_factory=lambda: [0] * len(COUNTER_FIELDS))

    def add(self, values: Iterable[int]) -> None:
        self.counters = [a + (b or 0) for a, b in zip(self.counters, values, strict=True)]

    @property
    def held_gpu_hours(self) -> float:
        return self.counters[0] / MS_PER_HOUR

    @property
    def held_gib_hours(self) -> float:
        return self.counters[1] / BYTE_SECONDS_PER_GIB_HOUR

    @property
    def busy_gpu_hours(self) -> float:
        return self.counters[2] / MS_PER_HOUR

    @property
    def idle_gpu_hours(self) -> float:
        return self.counters[3] / MS_PER_HOUR

    @property
    def unmeasured_gpu_hours(self) -> float:
        return self.counters[4] / MS_PER_HOUR

    @property
    def busy_estimated_gpu_hours(self) -> float:
        return self.counters[5] / MS_PER_HOUR

    @property
    def busy_is_estimate(self) -> bool:
        """No part of busy was measured (each process's own utilisation): all of it is the estimate."""
        return self.counters[5] == self.counters[2]


# The table's columns, written once: the page's header and cells, the CSV's header and cells.
COLUMNS = ["GPU-hours", "GiB-hours", "Busy GPU-hours", "Idle GPU-hours", "Unmeasured GPU-hours",
           "Estimated busy GPU-hours"]


@dataclass
class Row:
    key: str
    label: str
    total: Figures = field(default_factory=Figures)
    per_day: dict[date, Figures] = field(default_factory=lambda: defaultdict(Figures))

    def cells(self) -> list[str]:
        """The row as the table and the CSV show it (hours to two decimals)."""
        t = self.total
        return [self.label, *(f"{v:.2f}" for v in (t.held_gpu_hours, t.held_gib_hours, t.busy_gpu_hours,
                                                      t.idle_gpu_hours, t.unmeasured_gpu_hours,
                                                      t.busy_estimated_gpu_hours))]


@dataclass
class UsageTable:
    period: Period
    by: str
    sort: str
    rows: list[Row]

    @property
    def header(self) -> list[str]:
        return [Grouping(self.by).label, *COLUMNS]

    def day_series(self) -> list[list[float]]:
        """Per row, its GPU-hours on each day of the period (the chart)."""
        return [[row.per_day[d].held_gpu_hours if d in row.per_day else 0.0 for d in self.period.days]
                for row in self.rows]


_GROUP_COLUMNS = ["host_id", "host__name", "user", "uid", "owner_label", "owner_kind", "owner_uid",
                  "device_model"]


def _grouped(period: Period) -> Any:
    return (UsageDay.objects.filter(day__gte=period.start, day__lte=period.end)
            .values("day", *_GROUP_COLUMNS).order_by()
            .annotate(**{name: Sum(name) for name in COUNTER_FIELDS}))


def _user_label(user: str, uid: int | None) -> str:
    return user or (f"uid {uid}" if uid is not None else "(unknown user)")


def _keyer(by: str) -> Any:
    """(key, label) of a grouped row for ``by``."""
    directories: dict[int, Directory] = {}

    def person(row: dict[str, Any]) -> tuple[str, str]:
        host_id = row["host_id"]
        if host_id not in directories:
            directories[host_id] = Directory.for_host(Host(pk=host_id))
        owner = {"kind": row["owner_kind"], "uid": row["owner_uid"]} if row["owner_kind"] else None
        found = directories[host_id].person_for(uid=row["uid"], user=row["user"], owner=owner)
        if found is not None:
            return f"person:{found.pk}", found.name
        user = _user_label(row["user"], row["uid"])
        return f"unmapped:{user}", f"{user} (not mapped to a person)"

    keyers = {
        Grouping.USER: lambda r: (_user_label(r["user"], r["uid"]),) * 2,
        Grouping.PERSON: person,
        Grouping.OWNER: lambda r: (r["owner_label"], r["owner_label"] or "(no owner)"),
        Grouping.HOST: lambda r: (r["host__name"],) * 2,
        Grouping.GPU_MODEL: lambda r: (r["device_model"], r["device_model"] or "(unnamed)"),
    }
    return keyers[Grouping(by)]


def usage_table(period: Period, by: str, sort: str = Sort.HELD) -> UsageTable:
    """The period's usage added up by ``by``, biggest first by ``sort`` (then by name)."""
    keyer = _keyer(by)
    rows: dict[str, Row] = {}
    for grouped in _grouped(period):
        key, label = keyer(grouped)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(key, label)
        values = [grouped[name] for name in COUNTER_FIELDS]
        row.total.add(values)
        row.per_day[grouped["day"]].add(values)
    index = 3 if sort == Sort.IDLE else 0
    ordered = sorted(rows.values(), key=lambda r: (-r.total.counters[index], r.label))
    return UsageTable(period, by, sort, ordered)


def processes_behind(period: Period, by: str, key: str) -> list[LifeUsage]:
    """The process lives behind one row of ``usage_table(period, by)``: those of its hosts, users,
    owners and models that held a device during the period (their figures are their whole life's)."""
    keyer = _keyer(by)
    combos = {(g["host_id"], g["user"], g["owner_label"], g["device_model"])
              for g in _grouped(period) if keyer(g)[0] == key}
    if not combos:
        return []
    where = Q()
    for host_id, user, label, model in combos:
        where |= Q(host_id=host_id, user=user, owner_label=label, device_model=model)
    return list(LifeUsage.objects.filter(where, first_at__lt=period.end_at, last_at__gte=period.start_at)
                .select_related("host").order_by("-held_milliseconds", "pk")[:1000])
