"""What the prunes of obligations and of sessions share (ADR 0053): a tombstone table in
the store, a trigger on the events table that refuses events of a tombstoned stream, the
streams read as stored, and each stream's end as the batch's re-check sees it.

On SQLite every application shares one events table whose rowid is the notification id
views track, and SQLite reuses the largest rowid once it is deleted: :meth:`newest`
tells a batch which event it must never delete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect, dialect_for


class StreamPruning:
    """One application's event store, its tombstone table ``tombstones_name`` and guard."""

    def __init__(self, app: Any, tombstones_name: str) -> None:
        self.app = app
        self.dialect: SqlDialect = dialect_for(app.recorder)
        self.postgres = self.dialect.name == "postgres"
        self.events = self.dialect.table(app.recorder.events_table_name)
        self.tombstones_name = tombstones_name
        self.tombstones = self.dialect.table(tombstones_name)

    def create_guard(self, c: Cursor, guard: str, *, first_only: bool, what: str) -> None:
        """The trigger ``guard``: an event (``first_only``: a version 1) of a tombstoned
        stream is refused as a unique violation, the error a lost race raises."""
        first = "NEW.originator_version = 1 AND " if first_only else ""
        if self.postgres:
            schema = self.dialect.datastore.schema
            c.execute(
                f'CREATE OR REPLACE FUNCTION "{schema}".{guard}() RETURNS trigger AS $$ '
                f"BEGIN IF {first}EXISTS (SELECT 1 FROM {self.tombstones} "
                "WHERE aggregate_id = NEW.originator_id) THEN "
                f"RAISE EXCEPTION '{what} % was pruned', NEW.originator_id "
                "USING ERRCODE = 'unique_violation'; END IF; RETURN NEW; END $$ "
                "LANGUAGE plpgsql"
            )
            c.execute(f"DROP TRIGGER IF EXISTS {guard} ON {self.events}")
            c.execute(
                f"CREATE TRIGGER {guard} BEFORE INSERT ON {self.events} "
                f'FOR EACH ROW EXECUTE FUNCTION "{schema}".{guard}()'
            )
        else:
            c.execute(
                f"CREATE TRIGGER IF NOT EXISTS {guard} BEFORE INSERT ON {self.events} "
                f"WHEN {first}EXISTS (SELECT 1 FROM "
                f"{self.tombstones} WHERE aggregate_id = NEW.originator_id) "
                f"BEGIN SELECT RAISE(ABORT, 'UNIQUE constraint failed: pruned {what}'); "
                "END"
            )

    def exists(self) -> bool:
        """Whether the tombstone table is there (a prune created it)."""
        with self.dialect.read_cursor() as c:
            if self.postgres:
                c.execute("SELECT to_regclass(%s) IS NOT NULL AS n", (self.tombstones,))
            else:
                c.execute(
                    "SELECT COUNT(*) AS n FROM sqlite_master WHERE type='table' AND name=?",
                    (self.tombstones_name,),
                )
            return bool(c.fetchone()["n"])

    def tombstone_row(self, aggregate_id: UUID) -> dict[str, Any] | None:
        """The tombstone row of one pruned stream (None: not pruned, or nothing ever was)."""
        if not self.exists():
            return None
        with self.dialect.read_cursor() as c:
            c.execute(
                self.dialect.sql(f"SELECT * FROM {self.tombstones} WHERE aggregate_id = ?"),
                (self.key(aggregate_id),),
            )
            row = c.fetchone()
        return None if row is None else dict(row)

    def key(self, aggregate_id: UUID) -> Any:
        return aggregate_id if self.postgres else aggregate_id.hex

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
                found[as_uuid(r["originator_id"])].append(
                    (int(r["originator_version"]), str(r["topic"]), bytes(r["state"]))
                )
        return found

    def newest(self, c: Cursor) -> int:
        """The notification id no batch may delete (SQLite would hand it out again)."""
        if self.postgres:
            return 1 << 62  # a sequence never hands an id out twice
        c.execute(f"SELECT MAX(rowid) AS n FROM {self.events}")
        return int(c.fetchone()["n"] or 0)

    def stream_ends(self, c: Cursor, aggregates: Sequence[UUID]) -> dict[UUID, tuple[int, int]]:
        """Each stream's last version and the notification id of its last event."""
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
            as_uuid(row["originator_id"]): (int(row["v"] or 0), int(row["n"] or 0))
            for row in c.fetchall()
        }

    def delete_streams(self, c: Cursor, tables: Sequence[str], keys: Sequence[Any]) -> None:
        """Delete the rows of the streams ``keys`` from each of ``tables`` (events, snapshots)."""
        marks = ", ".join("?" * len(keys))
        for table in tables:
            c.execute(
                self.dialect.sql(f"DELETE FROM {table} WHERE originator_id IN ({marks})"),
                list(keys),
            )


def as_uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))
