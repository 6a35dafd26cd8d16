"""The SQLite recorder every write goes through: events and their new data keys, one commit.

A write hands its stored events to ``insert_events`` with the data keys it sealed them
with (``keys``, a ``WriteKeys``: see ``infrastructure/eventstore/library.py``). One
transaction then checks that the stored keys it used are still there (``SessionErased``
otherwise, ADR 0028), inserts the rows of the keys it created (``KeyRaceLost`` if another
writer stored one of those subjects' keys first, ADR 0017), and appends the events; a
duplicate (aggregate id, version) raises the library's ``IntegrityError``, which is the
optimistic lock.

Writes use one connection of the recorder's own, kept open, in ``BEGIN IMMEDIATE``
transactions: the write lock is taken before the first read, so the key check always
reads the latest state and never has to upgrade a read lock (which fails at once, without
a busy wait, when another connection committed in between). Reads keep the library's
pooled connections. Same file, same table and INSERT statement, same ``synchronous``
(SQLite's default, FULL), same busy timeout as the library's own connections.
"""

from __future__ import annotations

import contextlib
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

from gateway_ledger.infrastructure.privacy.key_table import insert_staged_keys, require_live_keys
from gateway_ledger.infrastructure.privacy.keyring import WriteKeys


class KeyedSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """The library's SQLite recorder, whose writes also store the data keys they name."""

    stores_keys = True
    """Its transaction carries a write's new key rows (see ``WriteKeys``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._in_memory = self.datastore.pool.is_sqlite_memory_mode

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Append the events in one durable transaction, with the new key rows of ``keys``;
        returns their notification ids, unless ``notification_ids=False`` (nobody asks:
        one statement for all the rows then)."""
        keys: WriteKeys | None = kwargs.get("keys")
        with_ids: bool = kwargs.get("notification_ids", True)
        rows = [
            (
                s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
                s.originator_version,
                s.topic,
                s.state,
            )
            for s in stored_events
        ]
        if self._in_memory:  # one database per connection there
            with self.datastore.transaction(commit=True) as c:
                return self._append(c.sqlite_cursor, rows, keys, with_ids)
        with self._lock:
            conn = self._conn or self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    ids = self._append(conn.cursor(), rows, keys, with_ids)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
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
