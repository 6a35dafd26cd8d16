"""What every view of the obligations' events shares: its runner, its table, its upkeep."""

from __future__ import annotations

from typing import Any

from eventsourcing.application import Application
from eventsourcing.utils import get_topic

from gateway_ledger.domain.obligation import DeliveryObligation
from gateway_ledger.infrastructure.sql_dialect import Cursor, SqlDialect
from gateway_ledger.projections.runner import DEFAULT_BATCH_SIZE, ProjectionRunner


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
