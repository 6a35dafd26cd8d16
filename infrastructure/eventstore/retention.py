"""Prune resolved obligations out of the hot store: archive, tombstone, delete (ADR 0053).

One batch is one write transaction: it locks the views' tracking rows (a view catching
up waits), re-checks each obligation against the store (its stream still ends where the
index said, and every event of it is already in both views), deletes its events and its
view rows, and inserts its tombstone. A trigger on the events table makes the store
refuse a new first event for a tombstoned id, so recording a pruned id again fails as
recording an existing one does (the ledger then answers idempotently).

On SQLite a notification id is the events table's rowid, which SQLite reuses after the
largest is deleted; a batch never deletes the stream holding the largest rowid, so a
view's position is never handed to a new event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from gateway_ledger.domain.delivery.retention import PRUNABLE_STATES, Tombstone
from gateway_ledger.infrastructure.eventstore.pruning import StreamPruning
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.projections.delivery.obligation_view import from_micros, to_micros

TOMBSTONES = "pruned_obligations"
GUARD = "pruned_obligations_guard"
COLUMNS = (
    "aggregate_id",
    "obligation_id",
    "state",
    "platform",
    "recorded_at",
    "resolved_at",
    "send_attempts",
    "error_class",
    "abandon_reason",
    "events",
    "pruned_at",
    "archive",
)


class SqlRetention(StreamPruning):
    """The ledger's retention on its own store (SQLite or PostgreSQL)."""

    def __init__(self, app: Any, views: Sequence[Any]) -> None:
        super().__init__(app, TOMBSTONES)
        self.views = list(views)  # SqlObligationView: .table, .runner.tracking_table
        self.index = next(v for v in self.views if v.name == "obligation_index")

    # -- the tombstone table and its guard --------------------------------------------------

    def ensure(self) -> None:
        kinds = "uuid" if self.postgres else "TEXT"
        with self.dialect.write_transaction() as c:
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {self.tombstones} ("
                f"aggregate_id {kinds} PRIMARY KEY, obligation_id TEXT NOT NULL, "
                "state TEXT NOT NULL, platform TEXT NOT NULL, recorded_at BIGINT NOT NULL, "
                "resolved_at BIGINT NOT NULL, send_attempts INTEGER NOT NULL, "
                "error_class TEXT, abandon_reason TEXT, events INTEGER NOT NULL, "
                "pruned_at BIGINT NOT NULL, archive TEXT NOT NULL)"
            )
            self.create_guard(c, GUARD, first_only=True, what="obligation")

    # -- reading ------------------------------------------------------------------------------

    def candidates(
        self,
        cutoff: datetime,
        limit: int,
        *,
        now: datetime,
        archive: str,
        reason: str | None = None,
    ) -> list[Tombstone]:
        """The tombstones of the obligations in a final state, readable, resolved before
        ``cutoff``, oldest first (from the obligation index, caught up by the caller)."""
        self.index.runner.ensure_tables()
        states = ", ".join(f"'{s}'" for s in sorted(PRUNABLE_STATES))
        with self.dialect.read_cursor() as c:
            c.execute(
                self.dialect.sql(
                    f"SELECT * FROM {self.index.table} WHERE state IN ({states}) "
                    "AND quarantine_reason IS NULL AND last_transition_at < ? "
                    + ("AND abandon_reason = ? " if reason is not None else "")
                    + f"ORDER BY last_transition_at, aggregate_id LIMIT {int(limit)}"
                ),
                (to_micros(cutoff),) if reason is None else (to_micros(cutoff), reason),
            )
            rows = [dict(r) for r in c.fetchall()]
        return [
            Tombstone(
                obligation_id=str(r["obligation_id"]),
                aggregate_id=str(r["aggregate_id"]),
                state=str(r["state"]),
                platform=str(r["platform"]),
                recorded_at=from_micros(r["recorded_at"]),
                resolved_at=from_micros(r["last_transition_at"]),
                send_attempts=int(r["send_attempts"]),
                error_class=r["error_class"],
                abandon_reason=r["abandon_reason"],
                events=int(r["version"]),
                pruned_at=now,
                archive=archive,
            )
            for r in rows
        ]

    def forget_tombstones(self, pruned_before: datetime) -> int:
        """Delete the tombstones of obligations pruned before ``pruned_before``: their ids
        may then be recorded again as new. Returns how many went."""
        if not self.exists():
            return 0
        moment = (to_micros(pruned_before),)
        with self.dialect.write_transaction() as c:
            c.execute(
                self.dialect.sql(
                    f"SELECT COUNT(*) AS n FROM {self.tombstones} WHERE pruned_at < ?"
                ),
                moment,
            )
            found = int(c.fetchone()["n"])
            c.execute(
                self.dialect.sql(f"DELETE FROM {self.tombstones} WHERE pruned_at < ?"), moment
            )
        return found

    def tombstone_count(self) -> int:
        if not self.exists():
            return 0
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT COUNT(*) AS n FROM {self.tombstones}")
            return int(c.fetchone()["n"])

    def tombstone(self, aggregate_id: UUID) -> Tombstone | None:
        row = self.tombstone_row(aggregate_id)
        return None if row is None else _tombstone(row)

    # -- the batch ------------------------------------------------------------------------------

    def remove(self, tombstones: Sequence[Tombstone]) -> tuple[list[Tombstone], float]:
        """Delete the streams of ``tombstones`` with their view rows, keep the tombstones;
        in one transaction. Returns those removed (one that changed meanwhile stays) and
        how long the transaction held the writers off, in seconds."""
        started = time.perf_counter()
        removed: list[Tombstone] = []
        with self.dialect.write_transaction() as c:
            if self.postgres:
                c.execute(f"LOCK TABLE {self.events} IN SHARE ROW EXCLUSIVE MODE")
            positions = [self._position(c, view) for view in self.views]
            applied = min(positions) if positions else 0
            newest = self.newest(c)
            ends = self.stream_ends(c, [UUID(t.aggregate_id) for t in tombstones])
            for stone in tombstones:
                last, top = ends.get(UUID(stone.aggregate_id), (0, 0))
                if last != stone.events or top > applied or top >= newest:
                    continue  # changed, not yet in a view, or holding the newest rowid
                removed.append(stone)
            if removed:
                keys = [self.key(UUID(t.aggregate_id)) for t in removed]
                marks = ", ".join("?" * len(removed))
                self.delete_streams(c, [self.events], keys)
                for view in self.views:
                    c.execute(
                        self.dialect.sql(
                            f"DELETE FROM {view.table} WHERE aggregate_id IN ({marks})"
                        ),
                        [t.aggregate_id for t in removed],
                    )
                c.executemany(
                    self.dialect.sql(
                        f"INSERT INTO {self.tombstones} ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(COLUMNS))})"
                    ),
                    [(key, *_row(t)[1:]) for key, t in zip(keys, removed, strict=True)],
                )
        return removed, time.perf_counter() - started

    def _position(self, c: Cursor, view: Any) -> int:
        c.execute(
            self.dialect.sql(
                f"SELECT notification_id FROM {view.runner.tracking_table} "
                "WHERE application_name = ?" + self.dialect.for_update
            ),
            (self.app.name,),
        )
        row = c.fetchone()
        return int(row["notification_id"]) if row else 0


def _row(stone: Tombstone) -> tuple[Any, ...]:
    return (
        stone.aggregate_id,
        stone.obligation_id,
        stone.state,
        stone.platform,
        to_micros(stone.recorded_at),
        to_micros(stone.resolved_at),
        stone.send_attempts,
        stone.error_class,
        stone.abandon_reason,
        stone.events,
        to_micros(stone.pruned_at),
        stone.archive,
    )


def _tombstone(row: dict[str, Any]) -> Tombstone:
    aggregate = row["aggregate_id"]
    return Tombstone(
        obligation_id=str(row["obligation_id"]),
        aggregate_id=(aggregate if isinstance(aggregate, UUID) else UUID(str(aggregate))).hex,
        state=str(row["state"]),
        platform=str(row["platform"]),
        recorded_at=from_micros(row["recorded_at"]),
        resolved_at=from_micros(row["resolved_at"]),
        send_attempts=int(row["send_attempts"]),
        error_class=row["error_class"],
        abandon_reason=row["abandon_reason"],
        events=int(row["events"]),
        pruned_at=from_micros(row["pruned_at"]),
        archive=str(row["archive"]),
    )


DEAD_STATES = ("abandoned", "quarantined")
"""Dead letters: replies the ledger gave up on (abandoned) or cannot read (quarantined)."""


class SqlDeadLetters:
    """The dead letters, read from the obligation index (no history replay)."""

    def __init__(self, index: Any) -> None:
        self.index = index
        self.dialect: SqlDialect = index.dialect

    def rows(
        self, *, reason: str | None = None, resolved_before: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Each dead letter: id, state, reason, platform, times, attempts, error class."""
        self.index.runner.ensure_tables()
        where = [f"state IN ({', '.join(repr(s) for s in DEAD_STATES)})"]
        params: list[Any] = []
        if reason is not None:
            where.append("COALESCE(abandon_reason, quarantine_reason) = ?")
            params.append(reason)
        if resolved_before is not None:
            where.append("last_transition_at < ?")
            params.append(to_micros(resolved_before))
        with self.dialect.read_cursor() as c:
            c.execute(
                self.dialect.sql(
                    "SELECT obligation_id, state, platform, send_attempts, claims, error_class, "
                    "COALESCE(abandon_reason, quarantine_reason) AS reason, recorded_at, "
                    f"last_transition_at FROM {self.index.table} WHERE {' AND '.join(where)} "
                    "ORDER BY last_transition_at, obligation_id"
                ),
                tuple(params),
            )
            found = [dict(r) for r in c.fetchall()]
        for row in found:
            row["recorded_at"] = from_micros(row["recorded_at"])
            row["last_transition_at"] = from_micros(row["last_transition_at"])
        return found

    def count_and_oldest(self) -> tuple[int, datetime | None]:
        self.index.runner.ensure_tables()
        with self.dialect.read_cursor() as c:
            c.execute(
                f"SELECT COUNT(*) AS n, MIN(last_transition_at) AS oldest FROM {self.index.table} "
                f"WHERE state IN ({', '.join(repr(s) for s in DEAD_STATES)})"
            )
            row = c.fetchone()
        n = int(row["n"] or 0)
        return n, (from_micros(row["oldest"]) if n else None)
