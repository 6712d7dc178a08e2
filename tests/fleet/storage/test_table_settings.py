"""How PostgreSQL keeps the tables ingest rewrites (fleet.storage.table_settings), set by migrations; on
PostgreSQL taken back cleanly, nothing on SQLite:

- room on the pages: ProcessLife's since fleet migration 0010, the rows every snapshot update rewrites
  since fleet 0020 and usage 0003;
- LZ4: the latest snapshot's document since fleet 0008, its update since fleet 0021, the usage cursor's
  lists since usage 0004 (its holders' index since 0005); values stored before kept readable.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet import synthetic
from gpuadmin.fleet.models import Gpu, Host, HostSummary, LatestSnapshot, ProcessLife
from gpuadmin.fleet.storage.table_settings import server_has_lz4
from gpuadmin.usage.models import UsageCursor

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


def _columns(tables: list[str], *, leaving_out: frozenset[str] = frozenset()) -> list[list[object]]:
    with connection.cursor() as cursor:
        return [[column for column in connection.introspection.get_table_description(cursor, table)
                 if column.name not in leaving_out] for table in tables]


# --- room on the pages ------------------------------------------------------------------------------

REWRITTEN = [Host, Gpu, LatestSnapshot, HostSummary, UsageCursor]
BEFORE_ROOM = [("fleet", "0019_history_sampled_figures"), ("usage", "0002_busy_measured_or_estimated")]
BEFORE_LIVES = [("fleet", "0009_process_life_description_digest")]
# Columns later migrations removed (fleet 0022) or added (usage 0005, fleet 0023): where an earlier state
# is compared with today's, left out on both sides.
CHANGED_LATER = frozenset({"last_probe_sent_at", "holder_index", "top_holder_life_id",
                           "top_holder_memory_bytes"})



def _options(model: type) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        (options,) = cursor.fetchone()
    return list(options or [])


@pytest.mark.postgres
def test_on_postgresql_the_rows_updates_rewrite_keep_room_and_going_back_gives_it_up() -> None:
    assert [_options(model) for model in REWRITTEN] == [["fillfactor=70"]] * len(REWRITTEN)
    assert _options(ProcessLife) == ["fillfactor=80"]  # fleet 0010's, through the same helper
    try:
        _migrate(BEFORE_ROOM)
        assert [_options(model) for model in REWRITTEN] == [[]] * len(REWRITTEN)
        assert _options(ProcessLife) == ["fillfactor=80"]
    finally:
        _migrate()
    assert [_options(model) for model in REWRITTEN] == [["fillfactor=70"]] * len(REWRITTEN)


@pytest.mark.postgres
def test_going_back_before_0010_gives_up_the_lives_room_and_coming_forward_keeps_it_again() -> None:
    try:
        _migrate(BEFORE_LIVES)
        assert _options(ProcessLife) == []
    finally:
        _migrate()
    assert _options(ProcessLife) == ["fillfactor=80"]


def test_the_migrations_leave_the_columns_as_they_were_both_ways() -> None:
    # SQLite has no fillfactor: there, this is all they may do (nothing). Back before 0010, later
    # migrations undo columns of their own: there, only the way back is compared.
    tables = [model._meta.db_table for model in (*REWRITTEN, ProcessLife)]
    before, kept = _columns(tables), _columns(tables, leaving_out=CHANGED_LATER)
    try:
        _migrate(BEFORE_ROOM)
        assert _columns(tables, leaving_out=CHANGED_LATER) == kept
        _migrate(BEFORE_LIVES)
    finally:
        _migrate()
    assert _columns(tables) == before


# --- LZ4 --------------------------------------------------------------------------------------------

COMPRESSED = {"fleet_latestsnapshot": ["update"],
              "usage_usagecursor": ["devices", "holder_bytes", "holders", "pending"]}
BEFORE_LZ4 = [("fleet", "0020_fillfactor_of_rows_every_update_rewrites"),
              ("usage", "0003_usage_cursor_fillfactor")]
LZ4 = {table: ["l"] * len(columns) for table, columns in COMPRESSED.items()}
DEFAULT = {table: [""] * len(columns) for table, columns in COMPRESSED.items()}
# Well past the ~2 kB at which PostgreSQL compresses a value, and compressible.
LARGE_UPDATE = {"gpus": [{"index": n, "memory_used_bytes": n * 1024**3, "utilization_percent": 50}
                         for n in range(200)]}



def _methods(columns: dict[str, list[str]] = COMPRESSED) -> dict[str, list[str]]:
    """Each column's method as the catalogue has it: 'l' LZ4, '' the server's default."""
    with connection.cursor() as cursor:
        found = {}
        for table, names in columns.items():
            found[table] = []
            for name in names:
                cursor.execute("SELECT attcompression FROM pg_attribute "
                               "WHERE attrelid = %s::regclass AND attname = %s", [table, name])
                found[table].append(cursor.fetchone()[0])
    return found


def _stored_update_method() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute('SELECT pg_column_compression("update") FROM fleet_latestsnapshot')
        (method,) = cursor.fetchone()
    return method


@pytest.mark.postgres
def test_on_postgresql_the_large_columns_use_lz4_and_going_back_gives_the_default_again() -> None:
    assert server_has_lz4(connection), "Debian's PostgreSQL is built with LZ4"
    assert _methods() == LZ4
    try:
        _migrate(BEFORE_LZ4)
        assert _methods() == DEFAULT
        assert _methods({"fleet_latestsnapshot": ["document"]}) == {"fleet_latestsnapshot": ["l"]}  # 0008's
    finally:
        _migrate()
    assert _methods() == LZ4
    assert _methods({"usage_usagecursor": ["holder_index"]}) == {"usage_usagecursor": ["l"]}  # usage 0005's


@pytest.mark.postgres
def test_a_value_written_before_stays_readable_and_the_next_one_is_written_with_lz4() -> None:
    host = synthetic.demo_hosts(settings.DATA_DIR, 1, gpus=2, processes=20, prefix="lz4")[0]
    assert synthetic.send(host, 0)
    latest = LatestSnapshot.objects.filter(host__name=host.name)
    try:
        _migrate(BEFORE_LZ4)
        latest.update(update=LARGE_UPDATE)
        assert _stored_update_method() == "pglz"
    finally:
        _migrate()
    assert latest.get().update == LARGE_UPDATE
    latest.update(update={**LARGE_UPDATE, "sequence": 2})
    assert _stored_update_method() == "lz4"
    assert latest.get().update == {**LARGE_UPDATE, "sequence": 2}


def test_the_migrations_change_no_column_both_ways() -> None:
    # SQLite compresses nothing: there, this is all they may do (nothing).
    before, kept = _columns(list(COMPRESSED)), _columns(list(COMPRESSED), leaving_out=CHANGED_LATER)
    try:
        _migrate(BEFORE_LZ4)
        assert _columns(list(COMPRESSED), leaving_out=CHANGED_LATER) == kept
    finally:
        _migrate()
    assert _columns(list(COMPRESSED)) == before
