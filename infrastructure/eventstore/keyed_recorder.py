"""The SQLite recorder every write goes through: events and their new data keys, one commit.

A write hands its stored events to ``insert_events`` with the data keys it sealed them
with (``keys``, a ``WriteKeys``: see ``infrastructure/eventstore/library.py``). One
transaction then checks that the stored keys it used are still there (``SessionErased``
otherwise, ADR 0028), inserts the rows of the keys it created (``KeyRaceLost`` if another
writer stored one of those subjects' keys first, ADR 0017), and appends the events; a
duplicate (aggregate id, version) raises the library's ``IntegrityError``, which is the
optimistic lock.

Writes use one connection of the recorder's own, kept open. A write with new key rows, or
one that wants notification ids, runs in a ``BEGIN IMMEDIATE`` transaction: the write lock
is taken before the first read, so the key check always reads the latest state and never
has to upgrade a read lock (which fails at once, without a busy wait, when another
connection committed in between).

A write without new key rows that wants no ids (the gateway's group commits: nearly every
write) is **one statement**, its own transaction: ``INSERT ... SELECT`` of the events' rows
``WHERE`` every used key is still stored (``LIVE_KEYS_CONDITION``). A statement that
writes starts by taking the write lock, as ``BEGIN IMMEDIATE`` does, so the key check
inside it reads the latest state too, and the events land whole or not at all. When the
check fails nothing is written, and the write runs again as a transaction, whose
``require_live_keys`` names the subjects erased. The reason is the interpreter lock: the
module releases it around each step of each statement and takes it back after, and
while the event loop runs Python each taking back may wait for the switch interval (5 ms).
A transaction of ``BEGIN``, a key check, one step per row and ``COMMIT`` took it back a
few hundred times per group; one statement takes it back once, so the insert, the fsync
and the checkpoint run beside the loop instead of between its turns (ADR 0074).

Reads keep the library's pooled connections. Same file, same table, same ``synchronous``
(SQLite's default, FULL), same busy timeout as the library's own connections.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    PersistenceError,
    StoredEvent,
)
from eventsourcing.sqlite import SQLITE3_DEFAULT_LOCK_TIMEOUT, SQLiteApplicationRecorder

from gateway_ledger.infrastructure.privacy.key_table import (
    LIVE_KEYS_CONDITION,
    insert_staged_keys,
    live_keys_params,
    require_live_keys,
)
from gateway_ledger.infrastructure.privacy.keyring import WriteKeys


class KeyedSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """The library's SQLite recorder, whose writes also store the data keys they name."""

    stores_keys = True
    """Its transaction carries a write's new key rows (see ``WriteKeys``)."""

    max_group = 32
    """Waited-for writes the gateway's group-commit writer puts in one group at most: a
    group's write runs beside the event loop (one statement), so with many conversations
    two or more groups per round of replies let the loop and the write overlap
    (``group_commit.py``, ADR 0077)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._in_memory = self.datastore.pool.is_sqlite_memory_mode
        self._max_parameters = 0  # the write connection's limit, read when it is opened
        self._json = False  # its SQLite has JSON functions (the one-statement key check)

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Append the events in one durable transaction, with the new key rows of ``keys``;
        returns their notification ids, unless ``notification_ids=False`` (nobody asks:
        then a write without new key rows is one statement, see the module's docstring)."""
        keys: WriteKeys | None = kwargs.get("keys")
        with_ids: bool = kwargs.get("notification_ids", True)
        if self._in_memory:  # one database per connection there
            with self.datastore.transaction(commit=True) as c:
                return self._append(c.sqlite_cursor, _rows(stored_events), keys, with_ids)
        with self._lock:
            conn = self._conn or self._connection()
            try:
                at_once = not with_ids and (keys is None or not keys.rows)
                if at_once and self._write_at_once(conn, stored_events, keys):
                    return None
                return self._write_in_transaction(conn, _rows(stored_events), keys, with_ids)
            except sqlite3.IntegrityError as e:
                raise IntegrityError(e) from e
            except sqlite3.OperationalError as e:
                self._reset()
                raise OperationalError(e) from e
            except sqlite3.DatabaseError as e:
                self._reset()
                raise DatabaseError(e) from e
            except sqlite3.Error as e:
                self._reset()
                raise PersistenceError(e) from e

    def _write_at_once(
        self, conn: sqlite3.Connection, stored_events: Sequence[StoredEvent], keys: WriteKeys | None
    ) -> bool:
        """The events in one statement, its own transaction, if every key they used is still
        stored; False when nothing was written (a used key is gone, the statement would need
        more parameters than SQLite takes, or this SQLite has no JSON functions for the key
        check): the caller writes them in a transaction."""
        count = len(stored_events)
        if not count:  # a statement needs a row: nothing to write goes as before
            return False
        size = count if count <= ROWS_BUCKET else -(-count // ROWS_BUCKET) * ROWS_BUCKET
        used = keys.used if keys is not None else None
        if 4 * size + 2 > self._max_parameters or (used and not self._json):
            return False
        params: list[Any] = [value for row in _rows(stored_events) for value in row]
        params += (None,) * (4 * (size - count))  # the padding rows, if any
        if used:
            params += live_keys_params(used)
        statement = _insert_at_once(self.events_table_name, size, bool(used))
        return conn.execute(statement, params).rowcount == count

    def _write_in_transaction(
        self,
        conn: sqlite3.Connection,
        rows: list[tuple[Any, ...]],
        keys: WriteKeys | None,
        with_ids: bool,
    ) -> list[int] | None:
        """The write as one ``BEGIN IMMEDIATE`` transaction (see the module's docstring)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            ids = self._append(conn.cursor(), rows, keys, with_ids)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return ids

    def _append(
        self,
        cursor: sqlite3.Cursor,
        rows: list[tuple[Any, ...]],
        keys: WriteKeys | None,
        with_ids: bool,
    ) -> list[int] | None:
        """In the caller's write transaction: keys first (roll back on a refusal), events."""
        if keys is not None:
            if keys.used:
                require_live_keys(cursor, keys.used)  # SessionErased
            if keys.rows:
                insert_staged_keys(cursor, keys.rows, keys.replacing)  # KeyRaceLost
        statement = self.insert_events_statement
        if not with_ids:
            cursor.executemany(statement, rows)
            return None
        ids: list[int] = []
        for row in rows:
            cursor.execute(statement, row)
            ids.append(int(cursor.lastrowid or 0))
        return ids

    def synchronous(self) -> int:
        """The write connection's ``PRAGMA synchronous`` (2 = FULL); for benchmarks, tests."""
        with self._lock:
            return int(self._connection().execute("PRAGMA synchronous").fetchone()[0])

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            pool = self.datastore.pool
            self._conn = sqlite3.connect(
                pool.db_name,
                uri=True,
                timeout=pool.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
                isolation_level=None,  # explicit transactions
                check_same_thread=False,
            )
            self._max_parameters = self._conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            self._json = _has_json(self._conn)
        return self._conn

    def _reset(self) -> None:
        """After a store error, reconnect next time (the file may have been replaced)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def close(self) -> None:
        """Close the write connection (the pool's are closed with the application)."""
        with self._lock:
            self._reset()


ROWS_BUCKET = 8
"""A one-statement write of more rows than this is padded to a multiple of it with rows of
NULLs, which its ``WHERE`` leaves out: a few statement texts, each prepared once and kept
in the connection's statement cache, serve every size of group. Smaller writes (a lone
conversation's three events) get a statement of their own size: binding padding costs
them more than their rows."""


def _has_json(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite has its JSON functions (built in since 3.38, an option before)."""
    try:
        conn.execute("SELECT json_valid('{}')").fetchone()
    except sqlite3.OperationalError:
        return False
    return True


def _rows(stored_events: Sequence[StoredEvent]) -> list[tuple[Any, ...]]:
    return [
        (
            s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
            s.originator_version,
            s.topic,
            s.state,
        )
        for s in stored_events
    ]


@functools.lru_cache(maxsize=256)
def _insert_at_once(table: str, size: int, check_keys: bool) -> str:
    """``size`` rows of events, inserted only if every used key is still stored."""
    values = ", ".join(["(?, ?, ?, ?)"] * size)
    where = "column1 IS NOT NULL"
    if check_keys:
        where += f" AND {LIVE_KEYS_CONDITION}"
    return (
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        f"SELECT * FROM (VALUES {values}) WHERE {where}"
    )
