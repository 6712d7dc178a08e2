"""How PostgreSQL compresses the large values ingest rewrites: LZ4, set on their columns by migrations.

A value past about 2 kB is compressed as its row is written: the latest snapshot's document (~125 kB
of JSON for 200 processes; fleet 0008) and update (fleet 0021), the usage cursor's lists (usage 0004).
PostgreSQL's own method (pglz) costs its backend several times the CPU of LZ4 for each write
(``benchmarks/README.md``). A column's method applies to values written after it is set; those stored
before stay readable as they are. A server built without LZ4 keeps its default, and SQLite compresses
nothing: there, nothing is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import migrations
from django.db.backends.base.base import BaseDatabaseWrapper


def compress_with_lz4(app_label: str, columns: Mapping[str, Sequence[str]]) -> migrations.RunPython:
    """A migration's operation that has PostgreSQL compress the columns' new values with LZ4
    (``columns``: field names by model name), and with the server's default when it is undone."""
    return migrations.RunPython(_set_compression(app_label, columns, "lz4"),
                                _set_compression(app_label, columns, "default"), elidable=False)


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


def _set_compression(app_label: str, columns: Mapping[str, Sequence[str]],
                     method: str) -> Callable[[Any, Any], None]:
    def run(apps: Any, schema_editor: Any) -> None:
        if not server_has_lz4(schema_editor.connection):
            return
        quote = schema_editor.quote_name
        for model_name, field_names in columns.items():
            meta = apps.get_model(app_label, model_name)._meta
            changes = ", ".join(f"ALTER COLUMN {quote(meta.get_field(name).column)} SET COMPRESSION {method}"
                                for name in field_names)
            schema_editor.execute(f"ALTER TABLE {quote(meta.db_table)} {changes}", params=None)

    return run
