"""What every view of the obligations' events shares: its runner, its table, its upkeep."""

from __future__ import annotations

from typing import Any

from eventsourcing.application import Application
from eventsourcing.utils import get_topic

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import QUARANTINED, QuarantineReason
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.infrastructure.privacy.private_mapper import Undecodable
from gateway_ledger.projections.runner import DEFAULT_BATCH_SIZE, ProjectionRunner

QUARANTINE_COLUMNS = {"quarantine_reason": "TEXT", "quarantine_version": "BIGINT"}
"""Why and at which event version an obligation is quarantined (NULL: it is not)."""

STILL_READ = f"(quarantine_reason IS NULL OR quarantine_reason = '{QuarantineReason.UNREADABLE}')"
"""A row later events still change: one with an event this version cannot decode keeps
its quarantine whatever comes after (a transition in between is unknown); one quarantined
by a ``Quarantined`` fact (unreadable fields) may still be abandoned (ADR 0027)."""


class ObligationView:
    """A projection of DeliveryObligation events and its runner, as one object.

    Subclasses add ``create_tables`` and ``apply``. ``name`` is the view's table (and
    tracking) name; another name builds a shadow copy, which is how ``projections
    rebuild`` proves a from-scratch rebuild equals the incremental view.
    """

    topic_prefix = get_topic(DeliveryObligation) + "."  # the store may hold other apps' events

    def __init__(self, app: Application[Any], name: str) -> None:
        self.name = name
        self.app = app
        self.runner = ProjectionRunner(app, self)
        self.dialect = self.runner.dialect
        self.table = self.dialect.table(name)

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None:
        raise NotImplementedError

    def apply(self, cursor: Cursor, dialect: SqlDialect, fact: object) -> None:
        raise NotImplementedError

    def clear(self, cursor: Cursor, dialect: SqlDialect) -> None:
        cursor.execute(f"DELETE FROM {self.table}")

    def quarantine_row(self, bad: Undecodable) -> dict[str, Any]:
        """The columns of a row for an aggregate first seen through a bad event."""
        raise NotImplementedError

    def quarantine(self, cursor: Cursor, dialect: SqlDialect, bad: Undecodable) -> None:
        """The aggregate of ``bad`` is quarantined from here on: its row says so, or a row
        is made for it (its first event is the bad one, or it had left this view)."""
        row = self.quarantine_row(bad)
        row.update(
            aggregate_id=bad.originator_id.hex,
            state=QUARANTINED,
            quarantine_reason=bad.reason.value,
            quarantine_version=bad.originator_version,
            version=bad.originator_version,
        )
        names = ", ".join(row)
        marks = ", ".join("?" * len(row))
        still_read = STILL_READ.replace("quarantine_reason", f"{self.table}.quarantine_reason")
        cursor.execute(
            dialect.sql(
                f"INSERT INTO {self.table} ({names}) VALUES ({marks}) "
                "ON CONFLICT (aggregate_id) DO UPDATE SET state = excluded.state, "
                "quarantine_reason = excluded.quarantine_reason, "
                "quarantine_version = excluded.quarantine_version, version = excluded.version "
                f"WHERE {still_read}"
            ),
            tuple(row.values()),
        )

    def catch_up(
        self, *, batch_size: int = DEFAULT_BATCH_SIZE, max_batches: int | None = None
    ) -> int:
        return self.runner.catch_up(batch_size=batch_size, max_batches=max_batches)

    def rebuild(self, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        return self.runner.rebuild(batch_size=batch_size)

    def position(self) -> int:
        return self.runner.position()

    def count(self) -> int:
        self.runner.ensure_tables()
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT COUNT(*) AS n FROM {self.table}")
            return int(c.fetchone()["n"])
