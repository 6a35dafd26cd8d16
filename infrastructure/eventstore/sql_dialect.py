"""The small difference between SQLite and PostgreSQL that projections must bridge.

Projections write their SQL once, with ``?`` placeholders and bare table names; a
:class:`SqlDialect` qualifies the names (PostgreSQL keeps our tables in the URL's schema),
swaps the placeholders, and opens a write transaction that serialises with every other
writer of the same rows: ``BEGIN IMMEDIATE`` on SQLite (a deferred ``BEGIN`` would fail
with "database is locked" instead of waiting), a row lock (``FOR UPDATE``) on PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from eventsourcing.persistence import IntegrityError, OperationalError, PersistenceError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class Cursor(Protocol):
    def execute(self, sql: Any, params: Any = ...) -> Any: ...
    def executemany(self, sql: Any, params: Any) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> Any: ...


def check_identifier(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


class SqlDialect:
    """Base: what both stores share. Use :func:`dialect_for` to get the right one."""

    name = "sql"
    for_update = ""
    add_column = "ADD COLUMN"

    @property
    def data_errors(self) -> tuple[type[BaseException], ...]:
        """What a statement raises, at once, for values this store cannot hold."""
        return ()

    def __init__(self, datastore: Any) -> None:
        self.datastore = datastore

    def table(self, name: str) -> str:
        return check_identifier(name)

    def sql(self, text: str) -> str:
        """SQL written with ``?`` placeholders, in this store's placeholder style."""
        return text

    def add_missing_columns(self, cursor: Cursor, name: str, columns: dict[str, str]) -> None:
        """Add to table ``name`` the columns (name -> SQL type) it lacks: a view created by
        an earlier release gains them (NULL in its old rows) instead of failing to open."""
        present = self.column_names(cursor, name)
        for column, kind in columns.items():
            if column not in present:
                cursor.execute(
                    f"ALTER TABLE {self.table(name)} {self.add_column} "
                    f"{check_identifier(column)} {kind}"
                )

    def column_names(self, cursor: Cursor, name: str) -> set[str]:
        cursor.execute("SELECT name FROM pragma_table_info(?)", (check_identifier(name),))
        return {str(row["name"]) for row in cursor.fetchall()}

    def create_index(self, cursor: Cursor, index: str, name: str, columns: str) -> None:
        """The index ``index`` on table ``name`` (its ``columns``), unless it exists."""
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {check_identifier(index)} "
            f"ON {self.table(name)} ({columns})"
        )

    def create_tables(self, *statements: str) -> None:
        """Run ``CREATE TABLE IF NOT EXISTS`` statements in one transaction; tried again
        when two processes create them at once (PostgreSQL may refuse the second)."""
        for attempt in range(3):
            try:
                with self.write_transaction() as c:
                    for statement in statements:
                        c.execute(statement)
                return
            except Exception:
                if attempt == 2:
                    raise

    @contextmanager
    def write_transaction(self) -> Iterator[Cursor]:
        raise NotImplementedError

    @contextmanager
    def read_cursor(self) -> Iterator[Cursor]:
        with self.datastore.transaction(commit=False) as cursor:
            yield cursor


class SQLiteDialect(SqlDialect):
    name = "sqlite"

    @property
    def data_errors(self) -> tuple[type[BaseException], ...]:
        """What a statement raises, at once, for values this store cannot hold."""
        import sqlite3

        return (sqlite3.IntegrityError, sqlite3.DataError)

    @contextmanager
    def write_transaction(self) -> Iterator[Cursor]:
        import sqlite3

        with self.datastore.get_connection(commit=True) as conn:
            cursor = conn.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE")
                yield cursor
            except BaseException:
                conn.rollback()
                raise
            else:
                try:
                    conn.commit()
                except sqlite3.IntegrityError as e:
                    raise IntegrityError(e) from e
                except sqlite3.OperationalError as e:
                    raise OperationalError(e) from e
                except sqlite3.Error as e:
                    raise PersistenceError(e) from e
            finally:
                cursor.sqlite_cursor.close()


class PostgresDialect(SqlDialect):
    name = "postgres"
    for_update = " FOR UPDATE"

    @property
    def data_errors(self) -> tuple[type[BaseException], ...]:
        """What a statement raises, at once, for values this store cannot hold (a NUL in
        text is refused while the parameters are adapted, before anything is sent)."""
        import psycopg

        return (psycopg.DataError,)

    def table(self, name: str) -> str:
        schema = check_identifier(self.datastore.schema)
        return f'"{schema}"."{check_identifier(name)}"'

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    # A view's tables are checked at every process's first use of it. ``ALTER TABLE`` takes
    # an ACCESS EXCLUSIVE lock, and ``CREATE INDEX`` a SHARE lock, before they find that
    # there is nothing to do; queued behind a long read of the view, either would hold up
    # every other reader and writer of it. So the catalog is asked first, and only what is
    # missing is added (``IF NOT EXISTS`` still, for two processes adding it at once).
    add_column = "ADD COLUMN IF NOT EXISTS"

    def column_names(self, cursor: Cursor, name: str) -> set[str]:
        rows = _catalog(
            cursor,
            "SELECT attname AS name FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (self.table(name),),
        )
        return {str(row["name"]) for row in rows}

    def create_index(self, cursor: Cursor, index: str, name: str, columns: str) -> None:
        # An index lives in its table's schema: its name is qualified as a table's is.
        (row,) = _catalog(cursor, "SELECT to_regclass(%s) IS NOT NULL AS n", (self.table(index),))
        if not row["n"]:
            super().create_index(cursor, index, name, columns)

    @contextmanager
    def write_transaction(self) -> Iterator[Cursor]:
        # Pipeline mode: a projection's many small statements go out without waiting for
        # a round trip each; reads (fetchone) still sync where they must.
        with (
            self.datastore.get_connection() as conn,
            conn.pipeline(),
            conn.transaction(),
            conn.cursor() as cursor,
        ):
            yield cursor


def _catalog(cursor: Any, query: str, params: tuple[Any, ...]) -> list[Any]:
    """A catalog read inside a pipelined write transaction, on a cursor of its own: a
    cursor's rows in pipeline mode can be those of a statement it queued before."""
    with cursor.connection.cursor() as own:
        own.execute(query, params)
        return list(own.fetchall())


def dialect_for(recorder: Any) -> SqlDialect:
    """The dialect of an eventsourcing recorder's datastore (SQLite or PostgreSQL)."""
    datastore = recorder.datastore
    kind = type(datastore).__module__
    if kind.endswith(".sqlite"):
        return SQLiteDialect(datastore)
    if kind.endswith(".postgres"):
        return PostgresDialect(datastore)
    raise TypeError(f"no SQL dialect for datastore {type(datastore).__qualname__}")
