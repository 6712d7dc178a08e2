"""Room kept on pages (fleet.storage.page_room): ProcessLife's since fleet migration 0010, the rows every
snapshot update rewrites since fleet 0020 and usage 0003; on PostgreSQL, taken back cleanly; nothing on
SQLite."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from gpuadmin.fleet.models import Gpu, Host, HostSummary, LatestSnapshot, ProcessLife
from gpuadmin.usage.models import UsageCursor

REWRITTEN = [Host, Gpu, LatestSnapshot, HostSummary, UsageCursor]
BEFORE = [("fleet", "0019_history_sampled_figures"), ("usage", "0002_busy_measured_or_estimated")]
BEFORE_LIVES = [("fleet", "0009_process_life_description_digest")]

# Migrating runs outside a test transaction; serialized_rollback gives later tests back the rows
# migrations made, which the flush empties.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _options(model: type) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [model._meta.db_table])
        (options,) = cursor.fetchone()
    return list(options or [])


def _migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(target or executor.loader.graph.leaf_nodes())


@pytest.mark.postgres
def test_on_postgresql_the_rows_updates_rewrite_keep_room_and_going_back_gives_it_up() -> None:
    assert [_options(model) for model in REWRITTEN] == [["fillfactor=70"]] * len(REWRITTEN)
    assert _options(ProcessLife) == ["fillfactor=80"]  # fleet 0010's, through the same helper
    try:
        _migrate(BEFORE)
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


def _columns(models: list[type]) -> list[list[object]]:
    with connection.cursor() as cursor:
        return [connection.introspection.get_table_description(cursor, model._meta.db_table)
                for model in models]


def test_the_migrations_leave_the_columns_as_they_were_both_ways() -> None:
    # SQLite has no fillfactor: there, this is all they may do (nothing). Back before 0010, later
    # migrations undo columns of their own: there, only the way back is compared.
    models = [*REWRITTEN, ProcessLife]
    before = _columns(models)
    try:
        _migrate(BEFORE)
        assert _columns(models) == before
        _migrate(BEFORE_LIVES)
    finally:
        _migrate()
    assert _columns(models) == before
