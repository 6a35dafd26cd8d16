"""Prune ended sessions out of the hot store: archive, tombstone, delete (ADR 0053).

One batch is one write transaction: it re-checks each session against the store (its
stream still ends at the ``Reset`` the lifecycle scan saw), deletes its events and its
snapshots, and inserts its tombstone. A trigger on the sessions' events table makes the
store refuse any new event of a tombstoned session, so neither an import nor a switch
back to it re-creates the pruned session silently: the write fails as a write that lost
a race does, and the caller reloads and finds no such session.

On SQLite every application shares one events table whose rowid is the notification id
views track, and SQLite reuses the largest rowid once it is deleted: a batch never
deletes the stream holding the table's newest event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from gateway_ledger.domain.sessions.retention import SessionTombstone
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect, dialect_for
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


class SqlSessionRetention:
    """The session store's retention on its own store (SQLite or PostgreSQL)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.dialect: SqlDialect = dialect_for(app.recorder)
        self.postgres = self.dialect.name == "postgres"
        self.events = self.dialect.table(app.recorder.events_table_name)
        snapshots = getattr(app, "snapshots", None)
        self.snapshots = (
            None if snapshots is None else self.dialect.table(snapshots.recorder.events_table_name)
        )
        self.tombstones = self.dialect.table(TOMBSTONES)

    def ensure(self) -> None:
        kinds = "uuid" if self.postgres else "TEXT"
        with self.dialect.write_transaction() as c:
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {self.tombstones} ("
                f"aggregate_id {kinds} PRIMARY KEY, session_id TEXT NOT NULL, "
                "end_reason TEXT, created_at BIGINT NOT NULL, ended_at BIGINT NOT NULL, "
                "events INTEGER NOT NULL, pruned_at BIGINT NOT NULL, archive TEXT NOT NULL)"
            )
            if self.postgres:
                schema = self.dialect.datastore.schema
                c.execute(
                    f'CREATE OR REPLACE FUNCTION "{schema}".{GUARD}() RETURNS trigger AS $$ '
                    f"BEGIN IF EXISTS (SELECT 1 FROM {self.tombstones} "
                    "WHERE aggregate_id = NEW.originator_id) THEN "
                    "RAISE EXCEPTION 'session % was pruned', NEW.originator_id "
                    "USING ERRCODE = 'unique_violation'; END IF; RETURN NEW; END $$ "
                    "LANGUAGE plpgsql"
                )
                c.execute(f"DROP TRIGGER IF EXISTS {GUARD} ON {self.events}")
                c.execute(
                    f"CREATE TRIGGER {GUARD} BEFORE INSERT ON {self.events} "
                    f'FOR EACH ROW EXECUTE FUNCTION "{schema}".{GUARD}()'
                )
            else:
                c.execute(
                    f"CREATE TRIGGER IF NOT EXISTS {GUARD} BEFORE INSERT ON {self.events} "
                    "WHEN EXISTS (SELECT 1 FROM "
                    f"{self.tombstones} WHERE aggregate_id = NEW.originator_id) "
                    "BEGIN SELECT RAISE(ABORT, 'UNIQUE constraint failed: pruned session'); "
                    "END"
                )

    def exists(self) -> bool:
        with self.dialect.read_cursor() as c:
            if self.postgres:
                c.execute("SELECT to_regclass(%s) IS NOT NULL AS n", (self.tombstones,))
            else:
                c.execute(
                    "SELECT COUNT(*) AS n FROM sqlite_master WHERE type='table' AND name=?",
                    (TOMBSTONES,),
                )
            return bool(c.fetchone()["n"])

    def key(self, aggregate_id: UUID) -> Any:
        return aggregate_id if self.postgres else aggregate_id.hex

    def tombstones_all(self) -> list[SessionTombstone]:
        """Every pruned session's tombstone, oldest end first."""
        if not self.exists():
            return []
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT * FROM {self.tombstones} ORDER BY ended_at, session_id")
            return [_tombstone(dict(r)) for r in c.fetchall()]

    def tombstone(self, aggregate_id: UUID) -> SessionTombstone | None:
        if not self.exists():
            return None
        with self.dialect.read_cursor() as c:
            c.execute(
                self.dialect.sql(f"SELECT * FROM {self.tombstones} WHERE aggregate_id = ?"),
                (self.key(aggregate_id),),
            )
            row = c.fetchone()
        return None if row is None else _tombstone(dict(row))

    def streams(self, aggregate_ids: Sequence[UUID]) -> dict[UUID, list[tuple[int, str, bytes]]]:
        """Each stream's stored events (version, topic, state as stored: still sealed)."""
        found: dict[UUID, list[tuple[int, str, bytes]]] = {a: [] for a in aggregate_ids}
        if not aggregate_ids:
            return found
        marks = ", ".join("?" * len(aggregate_ids))
        with self.dialect.read_cursor() as c:
            c.execute(
                self.dialect.sql(
                    "SELECT originator_id, originator_version, topic, state FROM "
                    f"{self.events} WHERE originator_id IN ({marks}) "
                    "ORDER BY originator_id, originator_version"
                ),
                [self.key(a) for a in aggregate_ids],
            )
            for r in c.fetchall():
                found[_uuid(r["originator_id"])].append(
                    (int(r["originator_version"]), str(r["topic"]), bytes(r["state"]))
                )
        return found

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
            newest = self._newest(c)
            ends = self._stream_ends(c, [UUID(t.aggregate_id) for t in tombstones])
            for stone in tombstones:
                last, top = ends.get(UUID(stone.aggregate_id), (0, 0))
                if last != stone.events or top >= newest:
                    continue  # changed after its end (reopened, ...) or the newest rowid
                removed.append(stone)
            if removed:
                keys = [self.key(UUID(t.aggregate_id)) for t in removed]
                marks = ", ".join("?" * len(removed))
                for table in (self.events, self.snapshots):
                    if table is not None:
                        c.execute(
                            self.dialect.sql(
                                f"DELETE FROM {table} WHERE originator_id IN ({marks})"
                            ),
                            keys,
                        )
                c.executemany(
                    self.dialect.sql(
                        f"INSERT INTO {self.tombstones} ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(COLUMNS))})"
                    ),
                    [(key, *_row(t)) for key, t in zip(keys, removed, strict=True)],
                )
        return removed, time.perf_counter() - started

    def _newest(self, c: Cursor) -> int:
        if self.postgres:
            return 1 << 62  # a sequence never hands an id out twice
        c.execute(f"SELECT MAX(rowid) AS n FROM {self.events}")
        return int(c.fetchone()["n"] or 0)

    def _stream_ends(self, c: Cursor, aggregates: Sequence[UUID]) -> dict[UUID, tuple[int, int]]:
        if not aggregates:
            return {}
        nid = "notification_id" if self.postgres else "rowid"
        marks = ", ".join("?" * len(aggregates))
        c.execute(
            self.dialect.sql(
                f"SELECT originator_id, MAX(originator_version) AS v, MAX({nid}) AS n "
                f"FROM {self.events} WHERE originator_id IN ({marks}) GROUP BY originator_id"
            ),
            [self.key(a) for a in aggregates],
        )
        return {
            _uuid(row["originator_id"]): (int(row["v"] or 0), int(row["n"] or 0))
            for row in c.fetchall()
        }


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


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
        aggregate_id=_uuid(row["aggregate_id"]).hex,
        end_reason=row["end_reason"],
        created_at=from_micros(row["created_at"]),
        ended_at=from_micros(row["ended_at"]),
        events=int(row["events"]),
        pruned_at=from_micros(row["pruned_at"]),
        archive=str(row["archive"]),
    )
