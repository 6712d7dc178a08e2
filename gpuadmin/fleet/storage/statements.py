"""Ingest's fixed statements (and beat's upkeep's: rollups, settlings), their SQL written once per process.

Every snapshot runs the same dozen statements, and the ORM would build each one
anew on every call (a queryset clone, the compiler, each value through its
field). Here the SQL is kept per database and only the values change:

- ``PreparedQuery`` (a SELECT) and ``PreparedUpdate`` (an UPDATE): a queryset
  compiled once, with ``Param`` placeholders where each run's values go.
- ``RowInsert``: an INSERT or upsert of many rows, written from the model's
  columns. Every column that cannot be NULL must be given: model defaults are
  Django's, not the table's. On PostgreSQL the rows go as one JSON parameter,
  so the statement's text is the same for any number of rows.
- ``RowUpdate``: an UPDATE of many rows by key, each with its own values, in one statement.
- ``RowLookup``: a SELECT of the rows of many keys, in one statement.
- ``deferred()``: the rows of a batch of hosts' deferrable inserts and updates kept and written at
  the end, one statement each (``updates.receive_snapshot_updates``).
- ``pipelined()``: on PostgreSQL, statements inside a transaction are sent
  without waiting for each answer, so nothing run inside may depend on a row
  count (``PreparedUpdate.run`` returns none).

On PostgreSQL they bind on the server and are prepared once per connection
(``_cursor``). Why they stay, measured against the ORM's way
(``benchmarks/without/prepared-statements.patch``): benchmarks/README.md, "What each performance
mechanism is worth".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from functools import cache
from typing import Any, NamedTuple, cast

import msgspec
from django.db import DEFAULT_DB_ALIAS, connections, models, router
from django.db.models import F
from django.db.models.expressions import Expression
from django.db.models.sql.subqueries import UpdateQuery

from gpuadmin.fleet.storage.json_text import JsonTextField

# Fields whose values the database drivers take as they are (DateField and DateTimeField, JSONField and
# JsonTextField, a TextField, are adapted below).
_PLAIN_FIELDS = (models.IntegerField, models.FloatField, models.CharField, models.TextField,
                 models.BooleanField, models.ForeignKey, models.DateField, models.JSONField)


# What a binary PreparedQuery may read: the same values in either form (a ForeignKey's is its id).
_BINARY_READ_FIELDS = (models.IntegerField, models.BooleanField, models.CharField, models.TextField,
                       models.DateTimeField, models.ForeignKey)


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

    def bind(self, values: dict[str, Any], connection: Any) -> Any:
        return self.output_field.get_db_prep_save(values[self.name], connection)


class AnyOf(Expression):
    """A condition for ``filter()``: the model's ``field_name`` is one of the run's ``key`` values, a
    list of any length in one parameter (PostgreSQL: ``= ANY`` an array; SQLite: ``IN`` its JSON
    text's elements), so one statement serves any number of hosts. Integers and text only.

    PostgreSQL plans such a statement anew at every run: its plan for any list is costed for a list of
    unknown length, and a plan for the run's own list always looks cheaper. Once a batch that is
    nothing; a statement run for one host at a time, at every snapshot, takes a ``Param`` instead
    (``fleet.summary``)."""

    conditional = True

    def __init__(self, model: type[models.Model], field_name: str, *, key: str) -> None:
        field = _column(model, field_name)
        if not isinstance(field, models.IntegerField | models.CharField | models.ForeignKey):
            raise TypeError(f"AnyOf compares integers and text, not {type(field).__name__}")
        super().__init__(output_field=models.BooleanField())
        self.field_name, self.name = field_name, key
        self.column: Any = None

    def resolve_expression(self, query: Any = None, *args: Any, **kwargs: Any) -> AnyOf:
        resolved = self.copy()
        resolved.column = F(self.field_name).resolve_expression(query, *args, **kwargs)
        return resolved

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        column, params = compiler.compile(self.column)
        if connection.vendor == "postgresql":
            return f"{column} = ANY(%s)", [*params, self]
        return f"{column} IN (SELECT value FROM json_each(%s))", [*params, self]  # noqa: S608 - a column

    def bind(self, values: dict[str, Any], connection: Any) -> Any:
        items = list(values[self.name])
        return items if connection.vendor == "postgresql" else _encode_json(items).decode()


class _Compiled(NamedTuple):
    """A statement as compiled for one database, and what a SELECT's rows need, found once."""

    compiler: Any
    sql: str
    params: tuple[Any, ...]
    # A SELECT's: what the ORM's results_iter applies to each row (found once here, where the ORM
    # looks them up field by field on every run), and whether a column is a time.
    converters: dict[int, Any]
    reads_times: bool


class _Prepared:
    """SQL compiled once per database from a query with ``Param``s; each run binds new values.
    ``selects``: the query is a SELECT, whose columns' converters are found when it is compiled.
    ``binary``: on PostgreSQL its rows come in the binary form (``PreparedQuery``)."""

    def __init__(self, query: Any, alias: Callable[[], str], *, selects: bool = False,
                 binary: bool = False) -> None:
        self._query = query
        self._alias = alias
        self._selects = selects
        self._binary = binary
        self._compiled: dict[tuple[str, str], _Compiled] = {}

    def _send(self, values: dict[str, Any]) -> tuple[_Compiled, Any, Any]:
        """The statement run with ``values``: what it was compiled to, the cursor that has its answer
        (to read and close), and the connection."""
        alias = self._alias()
        connection = connections[alias]
        key = (alias, connection.vendor)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(alias)
        bound = [p.bind(values, connection) if isinstance(p, Param | AnyOf) else p for p in compiled.params]
        cursor = _cursor(connection, reads_times=compiled.reads_times, binary=self._binary)
        try:
            cursor.execute(compiled.sql, bound)
        except BaseException:
            cursor.close()
            raise
        return compiled, cursor, connection

    def _compile(self, alias: str) -> _Compiled:
        compiler = self._query.get_compiler(alias)
        sql, params = compiler.as_sql()
        columns = [selected[0] for selected in compiler.select[: compiler.col_count]] if self._selects else []
        if compiler.has_composite_fields(columns):
            raise TypeError("a PreparedQuery cannot select a composite primary key")
        if self._binary and not all(isinstance(c.output_field, _BINARY_READ_FIELDS) for c in columns):
            # Django loads jsonb (and inet) from its text itself; psycopg's binary loaders would hand it
            # other values. Numbers, booleans, text and times come back the same either way.
            raise TypeError("a binary PreparedQuery reads integers, booleans, text and times only")
        converters = cast(dict[int, Any], compiler.get_converters(columns)) if columns else {}
        reads_times = any(isinstance(column.output_field, models.DateTimeField) for column in columns)
        return _Compiled(compiler, sql, tuple(params), converters, reads_times)


class PreparedQuery(_Prepared):
    """A SELECT: ``queryset`` (a ``values_list``) with ``Param``s; ``rows(**values)`` its rows as tuples,
    converted as the queryset would give them.

    ``binary``: on PostgreSQL the rows come in the binary form, the same values: a number is its
    bytes, not digits for psycopg to parse (a snapshot's open lives hold ~1,600), a time its
    microseconds. Integers, booleans, text and times only.
    """

    def __init__(self, queryset: models.QuerySet[Any, Any], *, binary: bool = False) -> None:
        super().__init__(queryset.query, lambda: queryset.db, selects=True, binary=binary)

    def rows(self, **values: Any) -> list[tuple[Any, ...]]:
        return self.start(**values).rows()

    def start(self, **values: Any) -> PendingRows:
        """The SELECT sent, its rows read later (``PendingRows.rows()``): inside ``pipelined()`` the
        statements sent after it go out before its answer is awaited, and all come back in one round
        trip. Elsewhere it runs now."""
        compiled, cursor, connection = self._send(values)
        if connection.vendor == "postgresql":
            # psycopg holds the whole answer once it arrives: nothing sent later changes it.
            return PendingRows(compiled, cursor)
        # SQLite steps through the rows as they are fetched, and would see writes made meanwhile.
        with cursor:
            return PendingRows(compiled, rows=cursor.fetchall())


class PendingRows:
    """A SELECT's rows still to read (``PreparedQuery.start``): ``rows()`` waits for them, once;
    ``close()`` gives up on them."""

    def __init__(self, compiled: _Compiled, cursor: Any = None, *, rows: list[Any] | None = None) -> None:
        self._compiled = compiled
        self._cursor = cursor
        self._rows = rows

    def rows(self) -> list[tuple[Any, ...]]:
        """The rows, converted as the queryset would give them."""
        if self._cursor is not None:
            with self._cursor as cursor:
                self._rows = cursor.fetchall()
            self._cursor = None
        if self._rows is None:
            raise RuntimeError("these rows were read already or given up")
        rows, self._rows = self._rows, None
        compiled = self._compiled
        if not compiled.converters:
            return cast(list[tuple[Any, ...]], rows)
        return [tuple(row) for row in compiled.compiler.apply_converters(rows, compiled.converters)]

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
        self._cursor = self._rows = None


class PreparedUpdate(_Prepared):
    """``queryset.update(**fields)``, where ``fields`` values may be ``Param``s, run by ``run(**values)``.
    It returns no row count: inside ``pipelined()`` the count is not known when it returns."""

    def __init__(self, queryset: models.QuerySet[Any, Any], **fields: Any) -> None:
        query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
        query.add_update_values(fields)
        model = queryset.model
        super().__init__(query, lambda: router.db_for_write(model))

    def run(self, **values: Any) -> None:
        with self._send(values)[1]:
            pass  # nothing to read: the cursor is closed as Django closes one


class _Rows:
    """A statement that takes rows of values for ``fields`` of ``model`` (``RowInsert``, ``RowUpdate``,
    ``RowLookup``):
    on PostgreSQL the rows go as one JSON parameter, so the statement's text is the same for any
    number of rows; on SQLite as a VALUES list, in batches under its cap on bound parameters.

    ``deferrable``: inside ``deferred()``, rows given to ``run`` are kept and written at the block's
    end, with every other run's, by one statement. Only for a statement whose rows are each one
    host's own (no two runs in a block write the same row) and that nothing in the block reads back.
    """

    def __init__(self, model: type[models.Model], fields: Sequence[str], *, deferrable: bool = False) -> None:
        self.model = model
        self.fields = [_column(model, name) for name in fields]
        for field in self.fields:
            if not isinstance(field, _PLAIN_FIELDS):
                kind = type(field).__name__
                raise TypeError(f"{type(self).__name__} cannot pass {field.name} ({kind}) as it is")
        self.deferrable = deferrable
        self._times = [n for n, field in enumerate(self.fields) if isinstance(field, models.DateTimeField)]
        self._dates = [n for n, field in enumerate(self.fields)
                       if isinstance(field, models.DateField) and n not in self._times]
        self._json: dict[int, models.JSONField[Any]] = {
            n: field for n, field in enumerate(self.fields) if isinstance(field, models.JSONField)
        }
        for field in self._json.values():
            if field.encoder is not None:
                # On PostgreSQL the values go out as msgspec encodes them (_json_rows), not as this does.
                raise TypeError(f"{type(self).__name__} cannot write {field.name} with its own JSON encoder")
        # A document or ValidatedJson, as the field writes it (its text).
        self._document_texts = [
            (n, field) for n, field in enumerate(self.fields) if isinstance(field, JsonTextField)
        ]
        self._sql: dict[tuple[str, int, bool], str] = {}

    def _deferred(self, rows: Sequence[Sequence[Any]]) -> bool:
        """Whether ``rows`` were kept for the end of the enclosing ``deferred()`` block."""
        kept = _deferred_rows.kept
        if kept is None or not self.deferrable:
            return False
        kept.setdefault(self, []).extend(rows)
        return True

    def _execute(self, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def _json_rows(self, rows: Sequence[Sequence[Any]]) -> str:
        """PostgreSQL's one parameter: the rows as a JSON array of arrays, encoded by msgspec in one
        pass (times as RFC 3339 text, JSON values as themselves, a document as its text); the
        statement reads each element back as its column's type (``_json_element``)."""
        if self._document_texts:
            rows = [self._with_document_texts(row) for row in rows]
        # Text, not bytes: psycopg would send bytes as bytea.
        return _encode_json(rows).decode()

    def _sqlite_batches(self, connection: Any, rows: Sequence[Sequence[Any]]) -> Iterator[list[Any]]:
        """``rows`` as bound parameters, in batches under the database's cap on them (Django's own
        bulk_create batches alike)."""
        def prepare_json(field: models.JSONField[Any], value: Any) -> Any:
            return field.get_db_prep_save(value, connection)

        most = connection.features.max_query_params or len(rows) * len(self.fields)
        per_batch = max(1, most // len(self.fields))
        for start in range(0, len(rows), per_batch):
            params: list[Any] = []
            for row in rows[start : start + per_batch]:
                params.extend(self._adapted(row, connection.ops.adapt_datetimefield_value,
                                            connection.ops.adapt_datefield_value, prepare_json))
            yield params

    def _adapted(self, row: Sequence[Any], time: Callable[[Any], Any], day: Callable[[Any], Any],
                 document: Callable[[models.JSONField[Any], Any], Any]) -> list[Any]:
        """``row`` with each time given to ``time``, each date to ``day`` and each JSON value to
        ``document`` (with its field); None stays None."""
        values = self._with_document_texts(row)
        for n in self._times:
            if values[n] is not None:
                values[n] = time(values[n])
        for n in self._dates:
            if values[n] is not None:
                values[n] = day(values[n])
        for n, field in self._json.items():
            if values[n] is not None:
                values[n] = document(field, values[n])
        return values

    def _with_document_texts(self, row: Sequence[Any]) -> list[Any]:
        """``row`` with each ``JsonTextField`` value as the text its field writes."""
        values = list(row)
        for n, text_field in self._document_texts:
            values[n] = text_field.get_prep_value(values[n])
        return values

    def _statement(self, connection: Any, count: int, returns: bool = False) -> str:
        """The statement for ``count`` rows (0: PostgreSQL's one for any number, from JSON)."""
        key = (connection.vendor, count, returns)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = self._write(connection, count, returns)
        return sql

    def _write(self, connection: Any, count: int, returns: bool) -> str:
        raise NotImplementedError

    def _values(self, count: int) -> str:
        """SQLite's rows: ``count`` rows of bound values, ``VALUES (%s, ...), ...``."""
        row = "(" + ", ".join(["%s"] * len(self.fields)) + ")"
        return f"VALUES {', '.join([row] * count)}"

    def _named_values(self, alias: str, count: int) -> str:
        """SQLite's rows as ``alias`` with the columns ``c0``, ``c1``, ... (``_values``)."""
        names = ", ".join(f"c{n}" for n in range(len(self.fields)))
        return f"WITH {alias}({names}) AS ({self._values(count)})"

    def _from_json(self, connection: Any) -> str:
        """PostgreSQL's rows from the one JSON parameter: each element as its column's type, ``c0``,
        ``c1``, ... (only the model's own columns' types go into the text)."""
        elements = ", ".join(f"{_json_element(f, n, connection)} AS c{n}" for n, f in enumerate(self.fields))
        return f"SELECT {elements} FROM jsonb_array_elements(%s::jsonb) AS r(v)"  # noqa: S608 - own columns


class RowInsert(_Rows):
    """``INSERT INTO <model> (<fields>) VALUES ...``, optionally an upsert on ``conflict`` that sets
    ``update`` from the new row and adds the new row's ``add`` to the stored row's (counters), returning
    the ``returning`` fields of each row where the database can.

    Fields are named as on the model; a foreign key's value is the id. Every column that cannot be
    NULL must be given: model defaults are Django's, not the table's.
    """

    def __init__(self, model: type[models.Model], fields: Sequence[str], *, conflict: Sequence[str] = (),
                 update: Sequence[str] = (), add: Sequence[str] = (), returning: Sequence[str] = (),
                 deferrable: bool = False) -> None:
        super().__init__(model, fields, deferrable=deferrable and not returning)
        meta = model._meta
        # Django fills model defaults in Python, not in the table: a column left out is NULL.
        left_out = [f.name for f in meta.concrete_fields
                    if f not in self.fields and not f.primary_key and not f.null
                    and f.db_default is models.NOT_PROVIDED]
        if left_out:
            raise TypeError(f"RowInsert into {meta.label} must set {', '.join(left_out)} (not nullable)")
        self._conflict = [_column(model, name) for name in conflict]
        self._update = [_column(model, name) for name in update]
        self._add = [_column(model, name) for name in add]
        self._returning = [_column(model, name) for name in returning]

    def run(self, rows: Sequence[Sequence[Any]], *, returning: bool = True) -> list[tuple[Any, ...]] | None:
        """Insert ``rows`` (values in ``fields`` order); the ``returning`` values of each row, in order,
        or None when the database returns no rows from an insert or nothing was asked. ``returning``
        False: not this time (every id is known already), so inside ``pipelined()`` nothing waits."""
        if not rows:
            return [] if self._returning and returning else None
        if self._deferred(rows):
            return None
        connection = connections[router.db_for_write(self.model)]
        returns = returning and bool(self._returning) and connection.features.can_return_rows_from_bulk_insert
        with _cursor(connection) as cursor:
            if connection.vendor == "postgresql" and len(rows) > 1:
                cursor.execute(self._statement(connection, 0, returns), [self._json_rows(rows)])
                return [tuple(r) for r in cursor.fetchall()] if returns else None
            returned: list[tuple[Any, ...]] = []
            for params in self._sqlite_batches(connection, rows):
                cursor.execute(self._statement(connection, len(params) // len(self.fields), returns), params)
                if returns:
                    returned.extend(tuple(r) for r in cursor.fetchall())
        return returned if returns else None

    def _execute(self, rows: Sequence[Sequence[Any]]) -> None:
        self.run(rows, returning=False)

    def _write(self, connection: Any, count: int, returns: bool) -> str:
        # Only quoted names of the model's own table and columns go into the text; values are bound.
        name = connection.ops.quote_name
        columns = ", ".join(name(f.column) for f in self.fields)
        rows = self._values(count) if count else self._from_json(connection)
        table = name(self.model._meta.db_table)
        sql = f"INSERT INTO {table} ({columns}) {rows}"
        if self._conflict:
            sql += f" ON CONFLICT ({', '.join(name(f.column) for f in self._conflict)})"
            if self._update or self._add:
                sets = ", ".join([*(f"{name(f.column)} = EXCLUDED.{name(f.column)}" for f in self._update),
                                  *(f"{name(f.column)} = {table}.{name(f.column)} + EXCLUDED.{name(f.column)}"
                                    for f in self._add)])
                sql += f" DO UPDATE SET {sets}"
            else:
                sql += " DO NOTHING"
        if returns:
            sql += f" RETURNING {', '.join(name(f.column) for f in self._returning)}"
        return sql


class RowUpdate(_Rows):
    """``UPDATE <model> SET <fields>`` from rows of values, each row's first value the ``key`` of the
    row it sets (a primary key or a unique column): many rows, each with its own values, in one
    statement (``UPDATE ... FROM`` the rows: SQLite 3.33 and PostgreSQL). Rows whose key matches
    nothing set nothing; there is no row count (as ``PreparedUpdate``)."""

    def __init__(self, model: type[models.Model], key: str, fields: Sequence[str], *,
                 deferrable: bool = False) -> None:
        super().__init__(model, [key, *fields], deferrable=deferrable)

    def run(self, rows: Sequence[Sequence[Any]]) -> None:
        """Set each row's ``fields`` (values in ``(key, *fields)`` order)."""
        if rows and not self._deferred(rows):
            self._execute(rows)

    def _execute(self, rows: Sequence[Sequence[Any]]) -> None:
        connection = connections[router.db_for_write(self.model)]
        with _cursor(connection) as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(self._statement(connection, 0), [self._json_rows(rows)])
                return
            for params in self._sqlite_batches(connection, rows):
                cursor.execute(self._statement(connection, len(params) // len(self.fields)), params)

    def _write(self, connection: Any, count: int, returns: bool) -> str:
        # Only quoted names of the model's own table and columns go into the text; values are bound.
        name = connection.ops.quote_name
        table = name(self.model._meta.db_table)
        sets = ", ".join(f"{name(f.column)} = u.c{n}" for n, f in enumerate(self.fields) if n)
        where = f"{table}.{name(self.fields[0].column)} = u.c0"
        if count:
            return f"{self._named_values('u', count)} UPDATE {table} SET {sets} FROM u WHERE {where}"  # noqa: S608
        return f"UPDATE {table} SET {sets} FROM ({self._from_json(connection)}) AS u WHERE {where}"  # noqa: S608


class RowLookup(_Rows):
    """``SELECT <columns> FROM <model>`` for rows of ``key`` values, a unique key (at most one row each),
    the ``null`` fields NULL: the rows asked for and no other, in one statement for any number. On
    PostgreSQL the keys go as one JSON parameter and each is looked up by itself (LATERAL with a LIMIT:
    the planner would otherwise join a scan of the whole table, which it prefers while the table is
    small); on SQLite as VALUES batches, joined. ``columns``: integers, text and booleans, read as the
    database gives them."""

    def __init__(self, model: type[models.Model], key: Sequence[str], columns: Sequence[str], *,
                 null: Sequence[str] = ()) -> None:
        super().__init__(model, key)
        self.columns = [_column(model, name) for name in columns]
        for field in self.columns:
            if not isinstance(field, _BINARY_READ_FIELDS) or isinstance(field, models.DateTimeField):
                raise TypeError(f"RowLookup reads integers, text and booleans, not {field.name}")
        self.null = [_column(model, name) for name in null]

    def rows(self, keys: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
        """``columns`` of the row of each key found (values in ``key`` order), in no given order."""
        if not keys:
            return []
        connection = connections[router.db_for_read(self.model)]
        with _cursor(connection) as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(self._statement(connection, 0), [self._json_rows(keys)])
                return [tuple(row) for row in cursor.fetchall()]
            found: list[tuple[Any, ...]] = []
            for params in self._sqlite_batches(connection, keys):
                cursor.execute(self._statement(connection, len(params) // len(self.fields)), params)
                found.extend(tuple(row) for row in cursor.fetchall())
            return found

    def _write(self, connection: Any, count: int, returns: bool) -> str:
        # Only quoted names of the model's own table and columns go into the text; values are bound.
        name = connection.ops.quote_name
        table = name(self.model._meta.db_table)
        selected = ", ".join(f"l.{name(f.column)}" for f in self.columns)
        same = " AND ".join([*(f"l.{name(f.column)} = w.c{n}" for n, f in enumerate(self.fields)),
                             *(f"l.{name(f.column)} IS NULL" for f in self.null)])
        if count:
            return f"{self._named_values('w', count)} SELECT {selected} FROM w JOIN {table} l ON {same}"  # noqa: S608
        return (f"SELECT {selected} FROM ({self._from_json(connection)}) AS w CROSS JOIN LATERAL "  # noqa: S608
                f"(SELECT * FROM {table} l WHERE {same} LIMIT 1) l")


class _DeferredRows(threading.local):
    kept: dict[_Rows, list[Sequence[Any]]] | None = None


_deferred_rows = _DeferredRows()


@contextmanager
def deferred() -> Iterator[None]:
    """Inside, a deferrable ``RowInsert``'s or ``RowUpdate``'s rows are kept (``run`` returns at once,
    with nothing), and at the end of the block each such statement runs once with every run's rows,
    in the order the statements were first run: the writes of a batch of hosts, each as it would be
    written alone, in a handful of statements. Nothing is written when the block raises. Blocks do
    not nest."""
    if _deferred_rows.kept is not None:
        raise RuntimeError("deferred() blocks do not nest")
    kept: dict[_Rows, list[Sequence[Any]]] = {}
    _deferred_rows.kept = kept
    try:
        yield
    finally:
        _deferred_rows.kept = None
    for statement, rows in kept.items():
        statement._execute(rows)


@contextmanager
def pipelined(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Inside a transaction on PostgreSQL, send statements without waiting for each one's answer
    (psycopg's pipeline mode): a read waits for everything sent before it, the end of the block for
    the rest. Elsewhere (SQLite, outside a transaction) statements run one by one, as always.

    Only statements whose result nobody needs before the next read belong here, and nothing inside
    may depend on a row count (psycopg gives -1 until the answer arrives): no ``Model.save()``, whose
    update is judged by its count. An error surfaces at the next read or at the end of the block,
    as Django's exception (``wrap_database_errors``), and fails the transaction as any other."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not connection.in_atomic_block:
        yield
        return
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.pipeline():
        yield


def _cursor(connection: Any, *, reads_times: bool = False, binary: bool = False) -> Any:
    """A cursor for a fixed statement. On PostgreSQL, one that binds the values on the server: the
    statement is prepared on its first run (settings: ``prepare_threshold``) and the connection
    keeps it, so the server parses and plans it once per connection, not once per snapshot, and no
    value is spelled into the SQL text (the latest document's ~125 KB). Django's own cursors bind
    on the client and never prepare."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = _server_binding_cursor()(connection.connection)
    if binary:
        raw.format = _binary_format()
    session_zone = connection.connection.info.parameter_status("TimeZone") if reads_times else None
    if session_zone == "UTC" and connection.timezone is UTC:
        # Times as Django's own loader gives them (aware, in datetime.UTC: psycopg gives that in a UTC
        # session), read by psycopg's loader, in C: Django's is psycopg's Python one, set up anew for
        # each time column of each result and a few microseconds a value (the host row has eight).
        raw.adapters.register_loader("timestamptz", _psycopg_timestamptz_loader())
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


@cache
def _psycopg_timestamptz_loader() -> type:
    """psycopg's own loader of timestamptz text (in C where psycopg's C extension is installed)."""
    import psycopg
    from psycopg.pq import Format

    loader = psycopg.adapters.get_loader(psycopg.postgres.types["timestamptz"].oid, Format.TEXT)
    if loader is None:
        raise LookupError("psycopg has no loader of timestamptz")
    return loader


@cache
def _binary_format() -> Any:
    from psycopg.pq import Format

    return Format.BINARY


@cache
def _server_binding_cursor() -> type:
    """Django's server-binding cursor class (psycopg 3 only, imported when PostgreSQL is used), which
    also keeps a prepared statement's text where Django's query log reads it, as for any other."""
    # Defined only where psycopg 3 is installed: the stubs do not know it.
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    class PreparingCursor(ServerBindingCursor):
        def _send_query_prepared(self, name: bytes, pgq: Any, **options: Any) -> None:
            self._query = pgq  # psycopg sets it for an unprepared run only (Cursor._execute_send)
            super()._send_query_prepared(name, pgq, **options)

    return PreparingCursor


_encode_json = msgspec.json.Encoder().encode


def _json_element(field: models.Field[Any, Any], n: int, connection: Any) -> str:
    """Element ``n`` of a row ``v`` of ``_Rows._json_rows`` as the column's type, without its
    parameters (varchar, not varchar(64): no truncation on the way; the column still refuses what is
    too long). A JSON value is taken as it is, its null as SQL NULL (as the ORM stores None); any
    other null is SQL NULL anyway."""
    if isinstance(field, models.JSONField):
        return f"nullif(v->{n}, 'null'::jsonb)"
    db_type = field.db_type(connection)
    if db_type is None:
        raise TypeError(f"{field.name} has no column type")
    return f"(v->>{n})::{db_type.split('(')[0]}"


def _column(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.concrete:
        raise TypeError(f"{model._meta.label}.{name} is not a column")
    return field
