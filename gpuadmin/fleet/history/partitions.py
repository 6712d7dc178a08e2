"""History partitioned by day on PostgreSQL: created ahead, dropped whole at retention.

The history tables grow by the day and are kept by age (``retention.py``): raw GPU and host samples
``GPUADMIN_HISTORY_RAW_DAYS``, 5-minute rollups ``GPUADMIN_HISTORY_FINE_DAYS``, 30-minute rollups and
process points ``GPUADMIN_HISTORY_DAYS``. On PostgreSQL each is a table partitioned by range of its
time (``taken_at``, or the 5- or 30-minute ``bucket`` of the rollups), one partition per UTC day, plus
a default partition for anything outside them. Retention then drops a day's partition whole (no
row-by-row DELETE, no dead tuples for vacuum) once every row of it is past keeping; what is left (rows
in the default partition, raw samples or 5-minute rollups of a host not rolled up past them yet) goes
by the delete path, as on SQLite, where the same models are plain tables.

The tables become partitioned in migration 0016 (``convert``, its reverse ``unconvert``), the
30-minute rollups in 0018; the maintenance beat creates each day's partitions ``AHEAD_DAYS`` before
they are needed (``ensure_partitions``), so that ingest never writes into the default partition in a
normal day.
A partitioned table's primary key must include the partition key: the samples' and points' keys
are (id, taken_at) in the database, while Django goes on addressing rows by their unique id.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)

# Partitions exist from yesterday to this many days ahead (a host's clock may run a little ahead,
# and a central down over a weekend still has its days when it comes back).
AHEAD_DAYS = 3
BUCKET_SECONDS = 300  # retention.BUCKET_SECONDS (retention imports this module)
COARSE_BUCKET_SECONDS = 1800  # retention.COARSE_BUCKET_SECONDS
DEFAULT_SUFFIX = "_default"
_DAY_SUFFIX = re.compile(r"_p(\d{8})$")


@dataclass(frozen=True, slots=True)
class Partitioned:
    """One history table as partitioned: its name, its partition key, and its primary key before."""

    table: str
    column: str
    # Seconds per unit of the partition key when it is a bucket number; 0 when it is a time.
    bucket_seconds: int
    plain_key: tuple[str, ...]

    @property
    def partitioned_key(self) -> tuple[str, ...]:
        return self.plain_key if self.column in self.plain_key else (*self.plain_key, self.column)

    def bounds(self, day: date) -> tuple[Any, Any]:
        start = datetime.combine(day, time(), tzinfo=UTC)
        end = start + timedelta(days=1)
        if self.bucket_seconds:
            return int(start.timestamp()) // self.bucket_seconds, int(end.timestamp()) // self.bucket_seconds
        return start, end

    def partition(self, day: date) -> str:
        return f"{self.table}_p{day:%Y%m%d}"


GPU_SAMPLES = Partitioned("fleet_gpusample", "taken_at", 0, ("id",))
HOST_SAMPLES = Partitioned("fleet_hostsample", "taken_at", 0, ("id",))
PROCESS_POINTS = Partitioned("fleet_processpoint", "taken_at", 0, ("id",))
GPU_ROLLUPS = Partitioned("fleet_gpurollup", "bucket", BUCKET_SECONDS, ("gpu_id", "bucket"))
HOST_ROLLUPS = Partitioned("fleet_hostrollup", "bucket", BUCKET_SECONDS, ("host_id", "bucket"))
GPU_ROLLUPS_COARSE = Partitioned("fleet_gpurollupcoarse", "bucket", COARSE_BUCKET_SECONDS,
                                 ("gpu_id", "bucket"))
HOST_ROLLUPS_COARSE = Partitioned("fleet_hostrollupcoarse", "bucket", COARSE_BUCKET_SECONDS,
                                  ("host_id", "bucket"))
# What each migration partitions: a migration sees only the tables that exist at its point.
TABLES_0016 = (GPU_SAMPLES, HOST_SAMPLES, PROCESS_POINTS, GPU_ROLLUPS, HOST_ROLLUPS)
TABLES_0018 = (GPU_ROLLUPS_COARSE, HOST_ROLLUPS_COARSE)
TABLES = (*TABLES_0016, *TABLES_0018)


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def is_partitioned(table: Partitioned, using: BaseDatabaseWrapper | None = None) -> bool:
    """Whether ``table`` is partitioned here (PostgreSQL after migration 0016; never on SQLite)."""
    db = using or connection
    if db.vendor != "postgresql":
        return False
    with db.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(%s)", [table.table])
        return cursor.fetchone() is not None


def partition_days(table: Partitioned) -> list[date]:
    """The days ``table`` has a partition of, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [table.table])
        names = [row[0] for row in cursor.fetchall()]
    days = []
    for name in names:
        found = _DAY_SUFFIX.search(name)
        if found and name == table.partition(datetime.strptime(found.group(1), "%Y%m%d").date()):
            days.append(datetime.strptime(found.group(1), "%Y%m%d").date())
    return sorted(days)


def ensure_partitions(now: datetime, *, ahead_days: int = AHEAD_DAYS) -> int:
    """Create the partitions of yesterday to ``ahead_days`` ahead that are missing; return how many.

    A day whose rows are in the default partition already (the beat was down) cannot get its own
    partition until they are gone: it is logged and left to the default partition.
    """
    if connection.vendor != "postgresql":
        return 0
    today = now.astimezone(UTC).date()
    created = 0
    for table in TABLES:
        if not is_partitioned(table):
            continue
        have = set(partition_days(table))
        for offset in range(-1, ahead_days + 1):
            day = today + timedelta(days=offset)
            if day not in have and _create_partition(table, day):
                created += 1
    return created


def _create_partition(table: Partitioned, day: date) -> bool:
    low, high = table.bounds(day)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {_quote(table.partition(day))} "
                f"PARTITION OF {_quote(table.table)} FOR VALUES FROM (%s) TO (%s)", [low, high])
    except Exception as error:  # the default partition holds rows of that day
        logger.warning("history: no partition %s for now (%s); its rows stay in %s%s",
                       table.partition(day), error, table.table, DEFAULT_SUFFIX)
        return False
    return True


def drop_partitions(table: Partitioned, *, before: datetime | int,
                    blocked: str | None = None, params: Iterable[Any] = ()) -> list[str]:
    """Drop the day partitions of ``table`` whose every row is before ``before`` (a time, or a bucket
    for the rollups); ``blocked``: SQL with ``{partition}`` for the partition and ``%s`` for its upper
    bound then ``params``, true when some row in it must still be kept. Returns what was dropped."""
    if not is_partitioned(table):
        return []
    dropped = []
    for day in partition_days(table):
        high = table.bounds(day)[1]
        if high > before:
            break
        name = table.partition(day)
        if blocked is not None:
            with connection.cursor() as cursor:
                cursor.execute(blocked.format(partition=_quote(name)), [high, *params])
                if cursor.fetchone() is not None:
                    logger.info("history: %s still holds rows to keep; not dropped", name)
                    continue
        with transaction.atomic(), connection.cursor() as cursor:
            # Foreign keys are checked at commit: rows written earlier in this transaction (a test's)
            # leave checks pending, and a table with pending checks cannot be dropped. Checked now.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"DROP TABLE {_quote(name)}")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        dropped.append(name)
    return dropped


# --- migrations 0016 and 0018 -----------------------------------------------------------------------------


def convert(schema_editor: Any, now: datetime | None = None,
            tables: tuple[Partitioned, ...] = TABLES_0016) -> None:
    """Make each of ``tables`` partitioned by day, keeping its rows, indexes and constraints."""
    if schema_editor.connection.vendor != "postgresql":
        return
    today = (now or datetime.now(UTC)).date()
    for table in tables:
        _rebuild(schema_editor, table, partitioned=True, days=[today + timedelta(days=n)
                                                                for n in range(-1, AHEAD_DAYS + 1)])


def unconvert(schema_editor: Any, tables: tuple[Partitioned, ...] = TABLES_0016) -> None:
    """``convert``'s reverse: plain tables again, with their rows."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in tables:
        _rebuild(schema_editor, table, partitioned=False, days=[])


def _rebuild(schema_editor: Any, table: Partitioned, *, partitioned: bool, days: list[date]) -> None:
    db = schema_editor.connection
    quote = db.ops.quote_name
    name, staged = table.table, f"{table.table}__rebuilt"
    with db.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                       "AND tablename = %s AND indexname <> %s", [name, f"{name}_pkey"])
        indexes = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE conrelid = to_regclass(%s) AND contype = 'f'", [name])
        foreign_keys = cursor.fetchall()
        cursor.execute("SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) "
                       "AND a.attidentity <> '' AND NOT a.attisdropped", [name])
        identity = [row[0] for row in cursor.fetchall()]
    like = f"(LIKE {quote(name)} INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS)"
    schema_editor.execute(f"CREATE TABLE {quote(staged)} {like}"
                          + (f" PARTITION BY RANGE ({quote(table.column)})" if partitioned else ""))
    if partitioned:
        schema_editor.execute(f"CREATE TABLE {quote(name + DEFAULT_SUFFIX + '__rebuilt')} "
                              f"PARTITION OF {quote(staged)} DEFAULT")
        for day in days:
            low, high = table.bounds(day)
            schema_editor.execute(f"CREATE TABLE {quote(table.partition(day) + '__rebuilt')} "
                                  f"PARTITION OF {quote(staged)} FOR VALUES FROM (%s) TO (%s)", [low, high])
    # Only this module's own quoted table names go into the text.
    schema_editor.execute(f"INSERT INTO {quote(staged)} SELECT * FROM {quote(name)}")  # noqa: S608
    schema_editor.execute(f"DROP TABLE {quote(name)} CASCADE")
    schema_editor.execute(f"ALTER TABLE {quote(staged)} RENAME TO {quote(name)}")
    with db.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [name])
        for (partition,) in cursor.fetchall():
            schema_editor.execute(f"ALTER TABLE {quote(partition)} RENAME TO "
                                  f"{quote(partition.removesuffix('__rebuilt'))}")
    key = table.partitioned_key if partitioned else table.plain_key
    schema_editor.execute(f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(name + '_pkey')} "
                          f"PRIMARY KEY ({', '.join(quote(c) for c in key)})")
    for column in identity:
        # The new identity starts at 1: on from the rows copied.
        schema_editor.execute(f"SELECT setval(pg_get_serial_sequence(%s, %s), "  # noqa: S608
                              f"COALESCE((SELECT max({quote(column)}) FROM {quote(name)}), 0) + 1, false)",
                              [quote(name), column])
    for definition in indexes:
        schema_editor.execute(definition)
    for constraint, definition in foreign_keys:
        schema_editor.execute(f"ALTER TABLE {quote(name)} ADD CONSTRAINT {quote(constraint)} {definition}")
