"""A pure projection kept in one SQL table, with its tracking row: a MaterializedView.

The projection (``projections/``) says what each event changes; this class gives it a
table (the subclass's ``create_tables``), writes its changes through a
:class:`~gateway_ledger.infrastructure.views.writer.RowWriter` and lets a
:class:`~gateway_ledger.infrastructure.views.runner.ProjectionRunner` commit them with the
view's position. It also proves a view right: ``rebuild_and_verify`` replays the log into
a *shadow* copy (the same view in ``<name>_rebuild`` tables) up to the live view's
position and compares the two row by row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from eventsourcing.application import Application
from eventsourcing.persistence import Recording

from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.infrastructure.privacy.private_mapper import Undecodable
from gateway_ledger.infrastructure.views.fold import RowFold
from gateway_ledger.infrastructure.views.runner import ProjectionRunner, RowSink, catch_up_together
from gateway_ledger.infrastructure.views.writer import RowWriter
from gateway_ledger.projections.delivery.catalog import SHADOW_SUFFIX
from gateway_ledger.projections.rows import Value
from gateway_ledger.projections.view import (
    DEFAULT_BATCH_SIZE,
    MAX_DIFFERENCES,
    MaterializedView,
    Progress,
    Projection,
    RebuildReport,
    differences,
)

log = logging.getLogger("gateway_ledger.projections")


class SqlView(MaterializedView):
    """``projection`` kept in the table of the same name, keyed by ``key``.

    ``guard`` is the condition (see :class:`RowWriter`) under which a row still takes
    changes. Subclasses create the table, answer the view's queries and make the same view
    in other tables (:meth:`renamed`: a shadow).
    """

    key: ClassVar[str]
    guard: ClassVar[str] = ""
    column_defaults: ClassVar[Mapping[str, Value]] = {}
    """The table's columns whose default is not NULL (for folding, ``fold.py``)."""

    def __init__(self, app: Application[Any], projection: Projection) -> None:
        self.app = app
        self.projection = projection
        self.name = projection.name
        self.topic_prefix = projection.topic_prefix
        self.reads_personal_data = projection.reads_personal_data
        self.runner = ProjectionRunner(app, self)
        self.dialect = self.runner.dialect
        self.table = self.dialect.table(self.name)
        self.writer = RowWriter(self.dialect, self.name, self.key, self.guard)

    # -- what the runner asks of a view kept in SQL -----------------------------------------

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None:
        raise NotImplementedError

    def takes_changes(self, read: Callable[[str], Value]) -> bool:
        """The ``guard`` over a row held in memory (``read`` gives its columns); a view
        with a guard says it here too, or its batches are not folded."""
        return True

    def batch(self, cursor: Cursor, dialect: SqlDialect, keys: Collection[str] | None) -> RowSink:
        """Where one batch's changes go: folded for the rows of ``keys`` the store does
        not have yet, the others sent in runs of one statement (``fold.py``); with
        ``keys`` None (the batch applied again without folding, where a refusal names
        its event), each as a statement at once."""
        unguarded = self.guard and type(self).takes_changes is SqlView.takes_changes
        if keys is None or unguarded:
            return self.writer
        fold = RowFold(self.writer, self.takes_changes, self.column_defaults)
        fold.begin(cursor, keys)
        return fold

    def apply(self, cursor: Cursor, dialect: SqlDialect, event: object, sink: RowSink) -> None:
        change = self.projection.change(event)
        if change is not None:
            sink.write(cursor, change)

    def quarantine(
        self, cursor: Cursor, dialect: SqlDialect, bad: Undecodable, sink: RowSink
    ) -> None:
        sink.write(cursor, self.projection.quarantine(bad))

    def clear(self, cursor: Cursor, dialect: SqlDialect) -> None:
        cursor.execute(f"DELETE FROM {self.table}")

    def prepare(self) -> None:
        """Nothing to do before the view's transaction (a subclass may need something)."""

    # -- the MaterializedView port ----------------------------------------------------------

    def catch_up(
        self, *, batch_size: int = DEFAULT_BATCH_SIZE, max_batches: int | None = None
    ) -> int:
        return self.runner.catch_up(batch_size=batch_size, max_batches=max_batches)

    def follow(self, written: Sequence[Recording[Any]]) -> int:
        applied = self.runner.follow(written)
        return self.catch_up() if applied is None else applied

    def rebuild(self, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        return self.runner.rebuild(batch_size=batch_size)

    def position(self) -> int:
        return self.runner.position()

    def log_position(self) -> int:
        return self.app.recorder.max_notification_id() or 0

    def count(self) -> int:
        self.runner.ensure_tables()
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT COUNT(*) AS n FROM {self.table}")
            return int(c.fetchone()["n"])

    def rebuild_and_verify(
        self, *, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> RebuildReport:
        started = time.perf_counter()
        self.runner.catch_up(batch_size=batch_size)
        shadow = self.shadow()
        shadow.drop()
        shadow.runner.ensure_tables()
        replayed, position = 0, 0
        try:
            for _ in range(10):
                # Read the live rows with their position; bring the shadow to that position.
                target = self.runner.position()
                live_rows = self.rows()
                if self.runner.position() != target:
                    continue  # someone caught the live view up meanwhile: read again
                replayed += shadow.runner.catch_up(
                    batch_size=batch_size, up_to=target, progress=progress
                )
                position = target
                break
            rebuilt = shadow.rows()
        finally:
            shadow.drop()
        found = differences(live_rows, rebuilt)
        repaired = False
        if found:
            log.warning(
                "projection %s differs from its rebuild in %d rows; rebuilding it",
                self.name,
                len(found),
            )
            self.runner.rebuild(batch_size=batch_size)
            repaired = True
        report = RebuildReport(
            name=self.name,
            position=position,
            events_replayed=replayed,
            rows=len(rebuilt),
            equal=not found,
            differences=tuple(found[:MAX_DIFFERENCES]),
            repaired=repaired,
            elapsed_seconds=round(time.perf_counter() - started, 3),
        )
        log.info(
            "projection %s rebuilt from %d events to position %d: %d rows, equal=%s",
            self.name,
            replayed,
            position,
            report.rows,
            report.equal,
        )
        return report

    # -- shadows ----------------------------------------------------------------------------

    def renamed(self, name: str) -> SqlView:
        """The same view of the same application, kept in tables called ``name``."""
        raise NotImplementedError

    def shadow(self) -> SqlView:
        """The same view, kept in ``<name>_rebuild`` tables of its own."""
        return self.renamed(self.name + SHADOW_SUFFIX)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every row, by key, as the store holds it."""
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT * FROM {self.table}")
            return {str(row[self.key]): dict(row) for row in c.fetchall()}

    def drop(self) -> None:
        with self.dialect.write_transaction() as c:
            c.execute(f"DROP TABLE IF EXISTS {self.table}")
            c.execute(f"DROP TABLE IF EXISTS {self.runner.tracking_table}")


def catch_up_views(
    views: Sequence[MaterializedView], *, batch_size: int = DEFAULT_BATCH_SIZE
) -> list[int]:
    """Catch views up; views kept in SQL read and decode each batch once between them
    (``runner.catch_up_together``), any other on its own. How many each applied, in order."""
    in_sql = {i: view.runner for i, view in enumerate(views) if isinstance(view, SqlView)}
    together = dict(
        zip(in_sql, catch_up_together(list(in_sql.values()), batch_size=batch_size), strict=True)
    )
    return [
        together[i] if i in together else view.catch_up(batch_size=batch_size)
        for i, view in enumerate(views)
    ]
