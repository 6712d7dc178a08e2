"""How PostgreSQL keeps the tables ingest rewrites, set by migrations: room on their pages, LZ4 for their
large values. SQLite has neither setting: there, nothing is done.

- ``keep_room``: PostgreSQL's fillfactor. An UPDATE whose new row version fits on the old one's page,
  and changes no indexed column, is a heap-only tuple: no index takes an entry, and the page's dead
  versions are pruned as it is read. Tables rewritten at every snapshot or update keep room for that.
  Pages written before keep their fill until rewritten.
- ``compress_with_lz4``: a value past about 2 kB is compressed as its row is written: the latest
  snapshot's document (~125 kB of JSON for 200 processes; fleet 0008) and update (fleet 0021), the usage
  cursor's lists (usage 0004). PostgreSQL's own method (pglz) costs its backend several times the CPU of
  LZ4 for each write (``benchmarks/README.md``). A column's method applies to values written after it is
  set; those stored before stay readable as they are. A server built without LZ4 keeps its default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import migrations
from django.db.backends.base.base import BaseDatabaseWrapper

# (the schema editor's quote_name, the model's _meta, the fields named) -> the clauses of its ALTER TABLE
_Alteration = Callable[[Callable[[str], str], Any, Sequence[str]], str]


def keep_room(app_label: str, model_names: Sequence[str], percent: int) -> migrations.RunPython:
    """A migration's operation that fills the models' tables' pages up to ``percent``, and back to full
    pages when it is undone."""
    models: dict[str, Sequence[str]] = dict.fromkeys(model_names, ())
    return migrations.RunPython(
        _alter_tables(app_label, models, lambda quote, meta, fields: f"SET (fillfactor = {int(percent)})"),
        _alter_tables(app_label, models, lambda quote, meta, fields: "RESET (fillfactor)"), elidable=False)


def compress_with_lz4(app_label: str, columns: Mapping[str, Sequence[str]]) -> migrations.RunPython:
    """A migration's operation that has PostgreSQL compress the columns' new values with LZ4
    (``columns``: field names by model name), and with the server's default when it is undone."""
    def compress(method: str) -> _Alteration:
        return lambda quote, meta, fields: ", ".join(
            f"ALTER COLUMN {quote(meta.get_field(name).column)} SET COMPRESSION {method}" for name in fields)

    return migrations.RunPython(_alter_tables(app_label, columns, compress("lz4"), needs=server_has_lz4),
                                _alter_tables(app_label, columns, compress("default"), needs=server_has_lz4),
                                elidable=False)


def server_has_lz4(connection: BaseDatabaseWrapper) -> bool:
    """Whether the database can compress a column with LZ4 (PostgreSQL 14+ built with it).

    The server lists lz4 among default_toast_compression's values only when it
    was built with it; before 14 the setting does not exist.
    """
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def _on_postgresql(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql"


def _alter_tables(app_label: str, fields_by_model: Mapping[str, Sequence[str]], alteration: _Alteration,
                  *, needs: Callable[[BaseDatabaseWrapper], bool] = _on_postgresql,
                  ) -> Callable[[Any, Any], None]:
    """A RunPython function: one ALTER TABLE a model, where the database ``needs`` it."""
    def run(apps: Any, schema_editor: Any) -> None:
        if not needs(schema_editor.connection):
            return
        quote = schema_editor.quote_name
        for model_name, field_names in fields_by_model.items():
            meta = apps.get_model(app_label, model_name)._meta
            clauses = alteration(quote, meta, field_names)
            schema_editor.execute(f"ALTER TABLE {quote(meta.db_table)} {clauses}", params=None)

    return run
