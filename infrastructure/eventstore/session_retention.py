"""Prune ended sessions out of the hot store: archive, tombstone, delete (ADR 0053).

One batch is one write transaction: it re-checks each session against the store (its
stream still ends at the ``Reset`` the lifecycle scan saw), deletes its events and its
snapshots, and inserts its tombstone. A trigger on the sessions' events table makes the
store refuse any new event of a tombstoned session, so neither an import nor a switch
back to it re-creates the pruned session silently: the write fails as a write that lost
a race does, and the caller reloads and finds no such session.

A batch never deletes the stream holding the newest event on SQLite (``pruning.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from gateway_ledger.domain.sessions.retention import SessionTombstone
from gateway_ledger.infrastructure.eventstore.pruning import StreamPruning, as_uuid
from gateway_ledger.projections.delivery.obligation_view import from_micros, to_micros

TOMBSTONES = "pruned_sessions"
GUARD = "pruned_sessions_guard"
COLUMNS = (
    "aggregate_id",
    "session_id",
    "end_reason",
    "created_at",
    "ended_at",
    "events",
    "pruned_at",
    "archive",
)


class SqlSessionRetention(StreamPruning):
    """The session store's retention on its own store (SQLite or PostgreSQL)."""

    def __init__(self, app: Any) -> None:
        super().__init__(app, TOMBSTONES)
        snapshots = getattr(app, "snapshots", None)
        self.snapshots = (
            None if snapshots is None else self.dialect.table(snapshots.recorder.events_table_name)
        )

    def ensure(self) -> None:
        kinds = "uuid" if self.postgres else "TEXT"
        with self.dialect.write_transaction() as c:
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {self.tombstones} ("
                f"aggregate_id {kinds} PRIMARY KEY, session_id TEXT NOT NULL, "
                "end_reason TEXT, created_at BIGINT NOT NULL, ended_at BIGINT NOT NULL, "
                "events INTEGER NOT NULL, pruned_at BIGINT NOT NULL, archive TEXT NOT NULL)"
            )
            self.create_guard(c, GUARD, first_only=False, what="session")

    def tombstones_all(self) -> list[SessionTombstone]:
        """Every pruned session's tombstone, oldest end first."""
        if not self.exists():
            return []
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT * FROM {self.tombstones} ORDER BY ended_at, session_id")
            return [_tombstone(dict(r)) for r in c.fetchall()]

    def tombstone(self, aggregate_id: UUID) -> SessionTombstone | None:
        row = self.tombstone_row(aggregate_id)
        return None if row is None else _tombstone(row)

    def remove(
        self, tombstones: Sequence[SessionTombstone]
    ) -> tuple[list[SessionTombstone], float]:
        """Delete the streams and snapshots of ``tombstones``, keep the tombstones; in one
        transaction. Returns those removed (one that changed meanwhile stays) and how long
        the transaction held the writers off, in seconds."""
        started = time.perf_counter()
        removed: list[SessionTombstone] = []
        with self.dialect.write_transaction() as c:
            if self.postgres:
                c.execute(f"LOCK TABLE {self.events} IN SHARE ROW EXCLUSIVE MODE")
            newest = self.newest(c)
            ends = self.stream_ends(c, [UUID(t.aggregate_id) for t in tombstones])
            for stone in tombstones:
                last, top = ends.get(UUID(stone.aggregate_id), (0, 0))
                if last != stone.events or top >= newest:
                    continue  # changed after its end (reopened, ...) or the newest rowid
                removed.append(stone)
            if removed:
                keys = [self.key(UUID(t.aggregate_id)) for t in removed]
                tables = [self.events] + ([self.snapshots] if self.snapshots else [])
                self.delete_streams(c, tables, keys)
                c.executemany(
                    self.dialect.sql(
                        f"INSERT INTO {self.tombstones} ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(COLUMNS))})"
                    ),
                    [(key, *_row(t)) for key, t in zip(keys, removed, strict=True)],
                )
        return removed, time.perf_counter() - started


def _row(stone: SessionTombstone) -> tuple[Any, ...]:
    return (
        stone.session_id,
        stone.end_reason,
        to_micros(stone.created_at),
        to_micros(stone.ended_at),
        stone.events,
        to_micros(stone.pruned_at),
        stone.archive,
    )


def _tombstone(row: dict[str, Any]) -> SessionTombstone:
    return SessionTombstone(
        session_id=str(row["session_id"]),
        aggregate_id=as_uuid(row["aggregate_id"]).hex,
        end_reason=row["end_reason"],
        created_at=from_micros(row["created_at"]),
        ended_at=from_micros(row["ended_at"]),
        events=int(row["events"]),
        pruned_at=from_micros(row["pruned_at"]),
        archive=str(row["archive"]),
    )
