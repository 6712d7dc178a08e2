"""Migration 0010 keeps room on ProcessLife's pages on PostgreSQL, and is undone cleanly."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet.models import ProcessLife

BEFORE = ("fleet", "0009_process_life_description_digest")

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _table_options() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                       [ProcessLife._meta.db_table])
        (options,) = cursor.fetchone()
    return list(options or [])


def _migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


@pytest.mark.postgres
def test_on_postgresql_process_lives_keep_a_fifth_of_each_page_free() -> None:
    assert _table_options() == ["fillfactor=80"]


@pytest.mark.postgres
def test_going_back_resets_the_fill_and_coming_forward_sets_it_again() -> None:
    try:
        _migrate([BEFORE])
        assert _table_options() == []
    finally:
        _migrate()
    assert _table_options() == ["fillfactor=80"]


def test_the_migration_leaves_the_columns_as_they_were_both_ways() -> None:
    # SQLite has no fillfactor: there, this is all the migration may do (nothing).
    with connection.cursor() as cursor:
        before = connection.introspection.get_table_description(cursor, ProcessLife._meta.db_table)
    try:
        _migrate([BEFORE])
    finally:
        _migrate()
    with connection.cursor() as cursor:
        after = connection.introspection.get_table_description(cursor, ProcessLife._meta.db_table)
    assert after == before
