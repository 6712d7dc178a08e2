"""Room kept on a table's pages for its rows' next versions: PostgreSQL's fillfactor, set by migrations.

An UPDATE whose new row version fits on the old one's page, and changes no indexed column, is a
heap-only tuple: no index takes an entry, and the page's dead versions are pruned as it is read.
Tables rewritten at every snapshot or update keep room for that. SQLite has no such setting: there,
nothing is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def set_fillfactor(app_label: str, model_names: Sequence[str],
                   percent: int | None) -> Callable[[Any, Any], None]:
    """A ``RunPython`` function that fills the models' tables' pages up to ``percent`` (None: the
    default, full pages). Pages written before keep their fill until rewritten."""

    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        setting = f"SET (fillfactor = {int(percent)})" if percent else "RESET (fillfactor)"
        for name in model_names:
            table = schema_editor.quote_name(apps.get_model(app_label, name)._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} {setting}", params=None)

    return run
