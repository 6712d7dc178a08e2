"""LZ4 for the large values ingest rewrites (fleet.storage.compression): the latest snapshot's document
since fleet migration 0008, its update since fleet 0021, the usage cursor's lists since usage 0004; on
PostgreSQL, taken back cleanly, values stored before kept readable; nothing on SQLite."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet import synthetic
from gpuadmin.fleet.models import LatestSnapshot
from gpuadmin.fleet.storage.compression import server_has_lz4

COMPRESSED = {"fleet_latestsnapshot": ["update"],
              "usage_usagecursor": ["devices", "holder_bytes", "holders", "pending"]}
BEFORE = [("fleet", "0020_fillfactor_of_rows_every_update_rewrites"),
          ("usage", "0003_usage_cursor_fillfactor")]
LZ4 = {table: ["l"] * len(columns) for table, columns in COMPRESSED.items()}
DEFAULT = {table: [""] * len(columns) for table, columns in COMPRESSED.items()}
# Well past the ~2 kB at which PostgreSQL compresses a value, and compressible.
LARGE_UPDATE = {"gpus": [{"index": n, "memory_used_bytes": n * 1024**3, "utilization_percent": 50}
                         for n in range(200)]}

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


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


def _migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


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
        _migrate(BEFORE)
        assert _methods() == DEFAULT
        assert _methods({"fleet_latestsnapshot": ["document"]}) == {"fleet_latestsnapshot": ["l"]}  # 0008's
    finally:
        _migrate()
    assert _methods() == LZ4


@pytest.mark.postgres
def test_a_value_written_before_stays_readable_and_the_next_one_is_written_with_lz4() -> None:
    host = synthetic.demo_hosts(settings.DATA_DIR, 1, gpus=2, processes=20, prefix="lz4")[0]
    assert synthetic.send(host, 0)
    latest = LatestSnapshot.objects.filter(host__name=host.name)
    try:
        _migrate(BEFORE)
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
    def columns() -> list[object]:
        with connection.cursor() as cursor:
            return [connection.introspection.get_table_description(cursor, table) for table in COMPRESSED]

    before = columns()
    try:
        _migrate(BEFORE)
        assert columns() == before
    finally:
        _migrate()
    assert columns() == before
