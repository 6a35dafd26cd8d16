"""Append stored events the short way: the library's table and INSERT, one owned connection.

``Application.save`` is general: it collects events through protocol checks, borrows a
pooled connection (lock, pre-ping bookkeeping), builds ``Recording`` objects, puts
aggregates in a cache we do not use and calls ``notify``. The group-commit writer only
needs "these events, one transaction, durable", and on SQLite that general path's fixed
cost is paid again on every commit (figures: docs/performance.md).

:class:`SQLiteAppender` maps events with the application's own mapper (so sealing of
personal fields, ADR 0012, is unchanged), then runs the recorder's own INSERT statement
on a connection it keeps: same file, same table, same rows, same ``synchronous`` (SQLite's
default, FULL), same busy timeout. A duplicate (aggregate id, version) raises the
library's ``IntegrityError``, exactly as ``save`` does, so optimistic concurrency is
untouched. Other stores (PostgreSQL) keep ``app.save``: :func:`appender_for`.

A subject seen for the first time gets its data key in the same transaction as the
events sealed with it (``KeyRing.writing_new_keys``, ADR 0017): no separate key write,
and never a sealed event whose key was not stored. If another process stored a key for
the same subject in between, the transaction is rolled back and the events are sealed
again with that key. If a key the events were sealed with was destroyed by an erasure
(``sessions forget``, maybe in another process), the transaction is rolled back and
``SessionErased`` raised (ADR 0028).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    PersistenceError,
)
from eventsourcing.sqlite import SQLiteApplicationRecorder

from gateway_ledger.infrastructure.privacy.key_table import insert_staged_keys, require_live_keys
from gateway_ledger.infrastructure.privacy.keyring import KeyRing, StagedKeys

Append = Callable[[Sequence[Any]], None]


class SQLiteAppender:
    """One connection that only ever appends events (thread-safe; meant for one writer)."""

    def __init__(self, app: Application[Any]) -> None:
        recorder = app.recorder
        assert isinstance(recorder, SQLiteApplicationRecorder)
        pool = recorder.datastore.pool
        self.db_name = pool.db_name
        self.busy_timeout = float(pool.lock_timeout or 5)
        self.statement = recorder.insert_events_statement
        self.to_stored_event = app.mapper.to_stored_event
        keyring = getattr(app.mapper, "keyring", None)
        self.keyring: KeyRing | None = keyring if isinstance(keyring, KeyRing) else None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = sqlite3.connect(
                self.db_name,
                uri=True,
                timeout=self.busy_timeout,
                isolation_level=None,  # explicit transactions below
                check_same_thread=False,
            )
        return self._conn

    def synchronous(self) -> int:
        """The connection's ``PRAGMA synchronous`` (2 = FULL); for benchmarks and tests."""
        with self._lock:
            return int(self.connection().execute("PRAGMA synchronous").fetchone()[0])

    def __call__(self, events: Sequence[Any]) -> None:
        """Store the events in one transaction; returns once the commit is durable."""
        if self.keyring is None:
            self._store([self.to_stored_event(e) for e in events], None)
        else:
            self.keyring.writing_new_keys(
                lambda staged: self._store([self.to_stored_event(e) for e in events], staged)
            )

    def _store(self, stored: list[Any], staged: StagedKeys | None) -> None:
        """One transaction: new key rows (``KeyRaceLost`` if one lost a race), then events."""
        rows = [
            (
                s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
                s.originator_version,
                s.topic,
                s.state,
            )
            for s in stored
        ]
        with self._lock:
            conn = self.connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if staged is not None:
                        cursor = conn.cursor()
                        require_live_keys(cursor, staged.used)  # SessionErased: roll back
                        if staged.rows:
                            insert_staged_keys(cursor, staged.rows)
                    conn.executemany(self.statement, rows)
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

    def _reset(self) -> None:
        """After a store error, reconnect next time (the file may have been replaced)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._reset()


def appender_for(app: Application[Any]) -> Append:
    """The short path on SQLite; the library's ``save`` anywhere else."""
    if isinstance(app.recorder, SQLiteApplicationRecorder):
        return SQLiteAppender(app)

    def save(events: Sequence[Any]) -> None:
        app.save(*events)

    return save
