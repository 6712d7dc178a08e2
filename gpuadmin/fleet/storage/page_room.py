"""Room kept on a table's pages for its rows' next versions: PostgreSQL's fillfactor, set by migrations.

An UPDATE whose new row version fits on the old one's page, and changes no indexed column, is a
heap-only tuple: no index takes an entry, and the page's dead versions are pruned as it is read.
Tables rewritten at every snapshot or update keep room for that. SQLite has no such setting: there,
nothing is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import migrations


def keep_room(app_label: str, model_names: Sequence[str], percent: int) -> migrations.RunPython:
    """A migration's operation that fills the models' tables' pages up to ``percent``, and back to full
    pages when it is undone. Pages written before keep their fill until rewritten."""
    return migrations.RunPython(_set_fillfactor(app_label, model_names, percent),
                                _set_fillfactor(app_label, model_names, None), elidable=False)


def _set_fillfactor(app_label: str, model_names: Sequence[str],
                    percent: int | None) -> Callable[[Any, Any], None]:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        setting = f"SET (fillfactor = {int(percent)})" if percent else "RESET (fillfactor)"
        for name in model_names:
            table = schema_editor.quote_name(apps.get_model(app_label, name)._meta.db_table)
            schema_editor.execute(f"ALTER TABLE {table} {setting}", params=None)

    return run
