"""Row changes (``projections/rows.py``) as statements on one table, in either store.

A projection says what one event changes; this module is the one place that says how
that is written in SQL: an insert that keeps an existing row, an update or a delete of a
row that still takes changes (the view's ``guard``), an upsert that replaces a few columns.
Relative values are written against the row before the statement (``col + 1``, another
column's old value, a ``CASE`` over old values), so no change reads the row first.
Statements are built once per shape of change and reused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway_ledger.infrastructure.eventstore.sql_dialect import (
    Cursor,
    SqlDialect,
    check_identifier,
)
from gateway_ledger.projections.rows import (
    Add,
    Case,
    Delete,
    Insert,
    Previous,
    Relative,
    RowChange,
    Update,
    Upsert,
)


class RowWriter:
    """Writes row changes to ``table`` (keyed by ``key``) through ``dialect``.

    ``guard`` is a condition a row must meet to take an update, a delete or an upsert's
    replacement, written with ``{row}`` before each column (it is qualified where the
    statement needs it), e.g. ``{row}frozen IS NULL``; empty: every row does.
    """

    def __init__(self, dialect: SqlDialect, name: str, key: str, guard: str = "") -> None:
        self.dialect = dialect
        self.table = dialect.table(name)
        self.key = check_identifier(key)
        self.guard = guard.format(row="")
        self.qualified_guard = guard.format(row=f"{self.table}.")
        self._statements: dict[Any, str] = {}

    def finish(self, cursor: Cursor) -> None:
        """Nothing is held back: every change was written as it came."""

    def write(self, cursor: Cursor, change: RowChange) -> None:
        statement = self.statement(change)
        if statement is not None:
            cursor.execute(*statement)

    def statement(self, change: RowChange) -> tuple[str, list[object]] | None:
        """The statement that writes ``change`` and its parameters (None: it sets
        nothing). Changes of one shape share one statement text."""
        if type(change) is Update:
            return self._update(change)
        if type(change) is Insert:
            return self._insert_statement(tuple(change.values)), [
                change.key,
                *change.values.values(),
            ]
        if type(change) is Delete:
            return self._delete_statement(), [change.key]
        if type(change) is Upsert:
            return self._upsert(change)
        raise TypeError(f"not a row change: {change!r}")

    # -- statements -------------------------------------------------------------------------

    def _update(self, change: Update) -> tuple[str, list[object]] | None:
        values = change.values
        relative = change.relative
        if not values and not relative:
            return None  # nothing to set
        shape = (Update, tuple(values), tuple(relative.items()) if relative else ())
        sql = self._statements.get(shape)
        if sql is None:
            sql = self._statements[shape] = self._update_statement(values, relative)
        params = list(values.values())
        params.append(change.key)
        return sql, params

    def _update_statement(
        self, values: Mapping[str, object], relative: Mapping[str, Relative]
    ) -> str:
        sets = [f"{check_identifier(name)} = ?" for name in values]
        for name, value in relative.items():
            column = check_identifier(name)
            if isinstance(value, Add):
                sets.append(f"{column} = {column} + {int(value.amount)}")
            elif isinstance(value, Previous):
                sets.append(f"{column} = {check_identifier(value.column)}")
            else:
                sets.append(f"{column} = {_case(column, value)}")
        where = f"{self.key} = ?" + (f" AND {self.guard}" if self.guard else "")
        return self.dialect.sql(f"UPDATE {self.table} SET {', '.join(sets)} WHERE {where}")

    def insert_all(self, cursor: Cursor, inserts: Iterable[Insert]) -> None:
        """New rows of distinct keys, each kept where the key has a row already: one
        ``executemany`` per set of columns, not a statement each (a batch's folded rows,
        ``fold.py``). Inserts of different keys commute, so their order is not kept."""
        by_columns: dict[tuple[str, ...], list[tuple[object, ...]]] = {}
        for change in inserts:
            params = (change.key, *change.values.values())
            by_columns.setdefault(tuple(change.values), []).append(params)
        for names, rows in by_columns.items():
            cursor.executemany(self._insert_statement(names), rows)

    def _insert_statement(self, names: tuple[str, ...]) -> str:
        shape = (Insert, names)
        sql = self._statements.get(shape)
        if sql is None:
            sql = self._statements[shape] = self.dialect.sql(
                f"{self._insert_into(names)} ON CONFLICT ({self.key}) DO NOTHING"
            )
        return sql

    def _upsert(self, change: Upsert) -> tuple[str, list[object]]:
        names = tuple(change.values)
        shape = (Upsert, names, change.replace)
        sql = self._statements.get(shape)
        if sql is None:
            replaced = ", ".join(
                f"{check_identifier(c)} = excluded.{check_identifier(c)}" for c in change.replace
            )
            where = f" WHERE {self.qualified_guard}" if self.qualified_guard else ""
            sql = self._statements[shape] = self.dialect.sql(
                f"{self._insert_into(names)} ON CONFLICT ({self.key}) DO UPDATE SET {replaced}"
                + where
            )
        return sql, [change.key, *change.values.values()]

    def _insert_into(self, names: tuple[str, ...]) -> str:
        columns = ", ".join(check_identifier(n) for n in (self.key, *names))
        marks = ", ".join("?" * (len(names) + 1))
        return f"INSERT INTO {self.table} ({columns}) VALUES ({marks})"

    def _delete_statement(self) -> str:
        sql = self._statements.get(Delete)
        if sql is None:
            where = f"{self.key} = ?" + (f" AND {self.guard}" if self.guard else "")
            sql = self._statements[Delete] = self.dialect.sql(
                f"DELETE FROM {self.table} WHERE {where}"
            )
        return sql


def _case(column: str, case: Case) -> str:
    """``CASE WHEN a = 0 AND b = 1 THEN 1 ... ELSE column END``: integers only, inlined
    (a statement is built once per shape and reused, so its literals are constants)."""
    names = [check_identifier(c) for c in case.columns]
    whens = []
    for combination, result in case.choices:
        condition = " AND ".join(f"{n} = {int(v)}" for n, v in zip(names, combination, strict=True))
        whens.append(f"WHEN {condition} THEN {int(result)}")
    return f"CASE {' '.join(whens)} ELSE {column} END"
