"""One batch's row changes folded in memory, for the rows the batch itself creates.

A view's catch-up applies a batch of events in one transaction, one row change each
(``projections/rows.py``). Most obligations live their whole life inside one batch
(``Recorded``, ``Attempting``, ``Delivered``: three events a few milliseconds apart), and
then the view wrote a row and changed it twice (the index), or wrote it and deleted it
again (the recoverable view, which holds only what is still owed). A row that did not
exist when the batch began is known completely from the batch's own changes, so they are
applied to it here, in memory, and the row is written once, at the end of the batch: a
lifecycle costs the index one INSERT instead of three statements, and the recoverable view
nothing at all.

The fold gives exactly what the statements would have given, or it does not fold:

- only rows the store does not have when the batch begins are folded (one query for the
  keys it is given: the runner gives those of the aggregates the batch begins, ADR 0082);
  every other change goes to the store as the same statement as ever, in order, except
  that a run of changes that share one statement (a sweep's claims, one update of each
  orphan's row) is sent as that statement's rows in one ``executemany``;
- a change is applied in memory with the statements' own rules (:class:`RowWriter`): an
  insert keeps an existing row, an update, delete or upsert's replacement touches only a
  row that still takes changes (the view's guard, here as a predicate over the row), and
  relative values are computed from the row before the change; a column the row has not
  been given reads as its declared default;
- a change it cannot evaluate exactly (a value of another type than the rule expects, a
  column set twice) is not guessed at: the row is written as it stands and the change
  goes to the store, and the row is no longer folded;
- anything the store refuses while the fold writes (its rows are several events' work, so
  the event to blame is unknown) raises :class:`FoldFailed`, and the runner applies the
  batch again without folding, one statement per change, where a refusal names its event.

Changes to different rows commute (each touches one row, by key), so writing the folded
rows after the batch's other statements changes nothing a reader can see, and a held run
is sent before any other statement of the batch: the view's rows and its position still
commit together.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor
from gateway_ledger.infrastructure.views.writer import RowWriter
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
    Value,
)

Row = dict[str, Value]
TakesChanges = Callable[[Callable[[str], Value]], bool]
"""The view's guard over a row: called with a reader of the row's columns."""

EXISTING_CHUNK = 500
"""Keys asked for in one query when a batch begins (well under both stores' limits)."""


class FoldFailed(Exception):
    """The store refused a folded write, or the fold itself failed: apply the batch again
    without folding (not a refusal of any one event)."""


class _Unfoldable(Exception):
    """This change cannot be evaluated in memory exactly: send it to the store."""


class RowFold:
    """The row changes of one batch transaction on one view (see the module docstring).

    ``takes_changes`` is the view's guard; ``defaults`` the columns whose default is not
    NULL. Use: :meth:`begin` with the batch's keys, :meth:`write` each change in order,
    :meth:`finish` before the view's position is written.
    """

    def __init__(
        self,
        writer: RowWriter,
        takes_changes: TakesChanges,
        defaults: Mapping[str, Value],
    ) -> None:
        self.writer = writer
        self.takes_changes = takes_changes
        self.defaults = defaults
        self._rows: dict[str, Row | None] = {}
        """Keys folded here: their row as it now stands (None: no row)."""
        self._run_sql: str | None = None
        self._run: list[list[object]] = []
        """Changes to rows the store has, held while they share one statement."""
        self.folded = 0
        """Changes applied in memory in this batch (what the tests check was folded)."""

    # -- the batch ----------------------------------------------------------------------------

    def begin(self, cursor: Cursor, keys: Collection[str]) -> None:
        """Fold the rows of ``keys`` that the store does not have yet."""
        try:
            existing = set(self._existing(cursor, list(keys)))
        except Exception as e:
            raise FoldFailed(f"{type(e).__name__} while reading the batch's rows") from e
        self._rows = {key: None for key in keys if key not in existing}

    def write(self, cursor: Cursor, change: RowChange) -> None:
        """Apply one change: in memory for a folded row, else as a statement at once."""
        key = change.key
        rows = self._rows
        try:
            if key not in rows:
                self._hold(cursor, change)
                return
            row = rows[key]
            try:
                rows[key] = self._applied(row, change)
            except _Unfoldable:
                del rows[key]  # from here on this row is the store's
                if row is not None:
                    self._hold(cursor, Insert(key, row))
                self._hold(cursor, change)
                return
            self.folded += 1
        except FoldFailed:
            raise
        except Exception as e:
            raise FoldFailed(f"{type(e).__name__} while writing a folded batch") from e

    def finish(self, cursor: Cursor) -> None:
        """Send the run held, then write every folded row that exists at the end of the
        batch, once: together, as one statement's rows for each set of columns
        (``RowWriter.insert_all``)."""
        try:
            self._send_run(cursor)
            self.writer.insert_all(
                cursor, [Insert(key, row) for key, row in self._rows.items() if row is not None]
            )
        except Exception as e:
            raise FoldFailed(f"{type(e).__name__} while writing a folded batch") from e
        finally:
            self._rows = {}
            self._run, self._run_sql = [], None

    # -- changes to rows the store has --------------------------------------------------------

    def _hold(self, cursor: Cursor, change: RowChange) -> None:
        """Queue a change for the store: it joins the run held if it has the run's
        statement, else the run is sent first. Held changes keep their order."""
        statement = self.writer.statement(change)
        if statement is None:
            return
        sql, params = statement
        if sql != self._run_sql:
            self._send_run(cursor)
            self._run_sql = sql
        self._run.append(params)

    def _send_run(self, cursor: Cursor) -> None:
        run, sql = self._run, self._run_sql
        if not run or sql is None:
            return
        self._run, self._run_sql = [], None
        if len(run) == 1:
            cursor.execute(sql, run[0])
        else:
            cursor.executemany(sql, run)

    # -- one change, in memory ------------------------------------------------------------------

    def _applied(self, row: Row | None, change: RowChange) -> Row | None:
        """The row after ``change``, by the statements' rules (``RowWriter``)."""
        kind = type(change)
        if kind is Insert:
            return dict(change.values) if row is None else row  # type: ignore[union-attr]
        if row is None:
            if kind is Upsert:
                return dict(change.values)  # type: ignore[union-attr]
            return None  # an update or a delete of no row changes nothing
        if not self.takes_changes(lambda column: self._read(row, column)):
            return row
        if kind is Update:
            assert isinstance(change, Update)
            values, relative = change.values, change.relative
            if relative and not relative.keys().isdisjoint(values):
                raise _Unfoldable  # one column set twice in one statement
            new = dict(values)
            for column, rule in relative.items():
                new[column] = self._relative(row, column, rule)  # from the row before
            row.update(new)
            return row
        if kind is Delete:
            return None
        if kind is Upsert:
            assert isinstance(change, Upsert)
            for column in change.replace:
                row[column] = change.values[column]
            return row
        raise _Unfoldable

    def _read(self, row: Row, column: str) -> Value:
        """A column as the store would hold it: given, else its default."""
        if column in row:
            return row[column]
        return self.defaults.get(column)

    def _relative(self, row: Row, column: str, rule: Relative) -> Value:
        if isinstance(rule, Add):
            value = self._read(row, column)
            if value is None:
                return None  # NULL + n is NULL
            if type(value) is not int:
                raise _Unfoldable
            return value + int(rule.amount)
        if isinstance(rule, Previous):
            return self._read(row, rule.column)
        if isinstance(rule, Case):
            held = tuple(self._read(row, c) for c in rule.columns)
            if any(v is not None and type(v) is not int for v in held):
                raise _Unfoldable
            for combination, result in rule.choices:
                if all(
                    v is not None and v == int(c) for v, c in zip(held, combination, strict=True)
                ):
                    return int(result)
            return self._read(row, column)  # ELSE the column keeps its value
        raise _Unfoldable

    # -- the store --------------------------------------------------------------------------------

    def _existing(self, cursor: Cursor, keys: list[str]) -> Iterator[str]:
        writer = self.writer
        for start in range(0, len(keys), EXISTING_CHUNK):
            chunk = keys[start : start + EXISTING_CHUNK]
            marks = ", ".join("?" * len(chunk))
            cursor.execute(
                writer.dialect.sql(
                    f"SELECT {writer.key} AS k FROM {writer.table} WHERE {writer.key} IN ({marks})"
                ),
                chunk,
            )
            for found in cursor.fetchall():
                yield str(found["k"])


def declared_defaults(*definitions: str | Mapping[str, str]) -> dict[str, Value]:
    """The non-NULL integer defaults that column definitions declare (``name TYPE ...
    DEFAULT 0``): what an insert that leaves such a column out stores in it."""
    found: dict[str, Value] = {}
    for definition in definitions:
        items = (
            definition.items()
            if isinstance(definition, Mapping)
            else (_split(part) for part in definition.split(","))
        )
        for name, rest in items:
            words = rest.split()
            upper = [w.upper() for w in words]
            if "DEFAULT" in upper:
                value: Any = words[upper.index("DEFAULT") + 1]
                if value.upper() != "NULL":
                    found[name] = int(value)
    return found


def _split(column: str) -> tuple[str, str]:
    name, _, rest = column.strip().partition(" ")
    return name, rest
