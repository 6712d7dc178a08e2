"""Ingest's fixed statements, their SQL written once per process.

Every snapshot runs the same dozen statements. The ORM builds each one anew on
every call (a queryset clone per method, the compiler, each value prepared
through its field): half a millisecond to a millisecond of CPU per statement,
several times what the database driver needs to send it. Here the SQL is kept
per database and only the values change:

- ``PreparedQuery`` (a SELECT) and ``PreparedUpdate`` (an UPDATE): a queryset
  the ORM compiles once, with ``Param`` placeholders where each run's values go
  (rows come back converted as ``values_list`` would give them).
- ``RowInsert``: an INSERT of many rows (optionally an upsert) written from
  the model's columns; numbers, text, booleans, times and foreign keys (ids)
  are handed to the driver as they are, only times get the backend's own form
  (SQLite stores text) and JSON values their field's (jsonb on PostgreSQL).
  Every column that cannot be NULL must be given: model defaults are
  Django's, not the table's. On PostgreSQL the rows go as one array per
  column (``INSERT ... SELECT * FROM UNNEST(...)``, as Django's own
  bulk_create does there): the statement's text is the same for any number
  of rows, so the driver parses it once, where a VALUES list of 200 rows
  (over psycopg's 50 cached parameters) was split anew on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from django.db import connections, models, router
from django.db.models.expressions import Expression
from django.db.models.sql.subqueries import UpdateQuery

# Fields whose values the database drivers take as they are (DateTimeField and JSONField are adapted
# below).
_PLAIN_FIELDS = (models.IntegerField, models.CharField, models.TextField, models.BooleanField,
                 models.ForeignKey, models.DateTimeField, models.JSONField)


class Param(Expression):
    """Where a value goes in a prepared statement: ``Param(Host, "name")`` takes the run's ``name``
    value, prepared as the model's field prepares it (``key``: another name for the value, when one
    statement compares a field with two)."""

    def __init__(self, model: type[models.Model], field_name: str, *, key: str = "") -> None:
        super().__init__(output_field=_column(model, field_name))
        self.name = key or field_name

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return "%s", [self]

    def resolve_expression(self, *args: Any, **kwargs: Any) -> Param:
        return self


class _Prepared:
    """SQL compiled once per database from a query with ``Param``s; each run binds new values."""

    def __init__(self, query: Any, alias: Callable[[], str]) -> None:
        self._query = query
        self._alias = alias
        self._compiled: dict[tuple[str, str], tuple[Any, str, tuple[Any, ...]]] = {}

    def _execute(self, values: dict[str, Any], read: Callable[[Any], Any]) -> tuple[Any, Any]:
        alias = self._alias()
        connection = connections[alias]
        key = (alias, connection.vendor)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiler = self._query.get_compiler(alias)
            sql, params = compiler.as_sql()
            compiled = self._compiled[key] = (compiler, sql, tuple(params))
        compiler, sql, params = compiled
        bound = [p.output_field.get_db_prep_save(values[p.name], connection) if isinstance(p, Param) else p
                 for p in params]
        with connection.cursor() as cursor:
            cursor.execute(sql, bound)
            return compiler, read(cursor)


class PreparedQuery(_Prepared):
    """A SELECT: ``queryset`` (a ``values_list``) with ``Param``s; ``rows(**values)`` its rows as tuples,
    converted as the queryset would give them."""

    def __init__(self, queryset: models.QuerySet[Any, Any]) -> None:
        super().__init__(queryset.query, lambda: queryset.db)

    def rows(self, **values: Any) -> list[tuple[Any, ...]]:
        compiler, rows = self._execute(values, lambda cursor: cursor.fetchall())
        return list(compiler.results_iter(results=[rows], tuple_expected=True))


class PreparedUpdate(_Prepared):
    """``queryset.update(**fields)``, where ``fields`` values may be ``Param``s; ``run(**values)`` the
    number of rows it changed."""

    def __init__(self, queryset: models.QuerySet[Any, Any], **fields: Any) -> None:
        query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
        query.add_update_values(fields)
        model = queryset.model
        super().__init__(query, lambda: router.db_for_write(model))

    def run(self, **values: Any) -> int:
        rowcount: int = self._execute(values, lambda cursor: cursor.rowcount)[1]
        return rowcount


class RowInsert:
    """``INSERT INTO <model> (<fields>) VALUES ...``, optionally an upsert on ``conflict`` that sets
    ``update`` from the new row, returning the ``returning`` fields of each row where the database can.

    Fields are named as on the model; a foreign key's value is the id.
    """

    def __init__(self, model: type[models.Model], fields: Sequence[str], *, conflict: Sequence[str] = (),
                 update: Sequence[str] = (), returning: Sequence[str] = ()) -> None:
        meta = model._meta
        self.model = model
        self.fields = [_column(model, name) for name in fields]
        for field in self.fields:
            if not isinstance(field, _PLAIN_FIELDS):
                raise TypeError(f"RowInsert cannot pass {field.name} ({type(field).__name__}) as it is")
        # Django fills model defaults in Python, not in the table: a column left out is NULL.
        left_out = [f.name for f in meta.concrete_fields
                    if f not in self.fields and not f.primary_key and not f.null
                    and f.db_default is models.NOT_PROVIDED]
        if left_out:
            raise TypeError(f"RowInsert into {meta.label} must set {', '.join(left_out)} (not nullable)")
        self._times = [n for n, field in enumerate(self.fields) if isinstance(field, models.DateTimeField)]
        self._json = [n for n, field in enumerate(self.fields) if isinstance(field, models.JSONField)]
        self._conflict = [_column(model, name) for name in conflict]
        self._update = [_column(model, name) for name in update]
        self._returning = [_column(model, name) for name in returning]
        self._sql: dict[tuple[str, int, bool], str] = {}

    def run(self, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]] | None:
        """Insert ``rows`` (values in ``fields`` order); the ``returning`` values of each row, in order,
        or None when the database returns no rows from an insert (or nothing was asked)."""
        if not rows:
            return [] if self._returning else None
        connection = connections[router.db_for_write(self.model)]
        returns = bool(self._returning) and connection.features.can_return_rows_from_bulk_insert
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                adapted = [self._adapted(row, connection) for row in rows]
                columns = [list(column) for column in zip(*adapted, strict=True)]
                cursor.execute(self._statement(connection, 0, returns), columns)
                return [tuple(r) for r in cursor.fetchall()] if returns else None
            # SQLite caps the bound parameters of one statement (Django's own bulk_create batches alike).
            most = connection.features.max_query_params or len(rows) * len(self.fields)
            per_batch = max(1, most // len(self.fields))
            returned: list[tuple[Any, ...]] = []
            for start in range(0, len(rows), per_batch):
                batch = rows[start : start + per_batch]
                params: list[Any] = []
                for row in batch:
                    params.extend(self._adapted(row, connection))
                cursor.execute(self._statement(connection, len(batch), returns), params)
                if returns:
                    returned.extend(tuple(r) for r in cursor.fetchall())
        return returned if returns else None

    def _adapted(self, row: Sequence[Any], connection: Any) -> list[Any]:
        values = list(row)
        for n in self._times:
            values[n] = connection.ops.adapt_datetimefield_value(values[n])
        for n in self._json:
            values[n] = self.fields[n].get_db_prep_save(values[n], connection)
        return values

    def _statement(self, connection: Any, count: int, returns: bool) -> str:
        """The statement for ``count`` rows (0: PostgreSQL's one for any number, from arrays)."""
        key = (connection.vendor, count, returns)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = self._write(connection, count, returns)
        return sql

    def _write(self, connection: Any, count: int, returns: bool) -> str:
        # Only quoted names of the model's own table and columns go into the text; values are bound.
        name = connection.ops.quote_name
        columns = ", ".join(name(f.column) for f in self.fields)
        if count:
            row = "(" + ", ".join(["%s"] * len(self.fields)) + ")"
            rows = f"VALUES {', '.join([row] * count)}"
        else:
            arrays = ", ".join(f"(%s)::{_array_type(f, connection)}" for f in self.fields)
            rows = f"SELECT * FROM UNNEST({arrays})"  # noqa: S608 - the model's own column types
        sql = f"INSERT INTO {name(self.model._meta.db_table)} ({columns}) {rows}"
        if self._conflict:
            sql += f" ON CONFLICT ({', '.join(name(f.column) for f in self._conflict)})"
            if self._update:
                sets = ", ".join(f"{name(f.column)} = EXCLUDED.{name(f.column)}" for f in self._update)
                sql += f" DO UPDATE SET {sets}"
            else:
                sql += " DO NOTHING"
        if returns:
            sql += f" RETURNING {', '.join(name(f.column) for f in self._returning)}"
        return sql


def _array_type(field: models.Field[Any, Any], connection: Any) -> str:
    """An array of the column's type, without its parameters (varchar[], not varchar(64)[]: no
    truncation on the way; the column still refuses what is too long)."""
    db_type = field.db_type(connection)
    if db_type is None:
        raise TypeError(f"{field.name} has no column type")
    return db_type.split("(")[0] + "[]"


def _column(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.concrete:
        raise TypeError(f"{model._meta.label}.{name} is not a column")
    return field
