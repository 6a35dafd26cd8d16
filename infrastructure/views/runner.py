"""Keep a view current by pulling the application's notification log into SQL tables.

SQLite offers no push subscription, so every view here is pulled: read the
notifications after the view's tracked position, decode them with the application's own
mapper (the view reads the very facts the aggregates are built from), and commit the
view's changes together with the new position in ONE transaction. A crash before the
commit loses nothing (the next catch-up re-reads the same notifications); a crash after
it repeats nothing. Each view has its own tracking table, so views never share a
position.

One event that does not decode (a flipped byte, an event type a newer release wrote) or
whose change the store refuses never stops the view: it is handed to the view's
``quarantine`` in its place, in the same transaction as the position, so a rebuild finds
the same (ADR 0027).

Several processes may catch the same view up at once: notifications are read outside
the write transaction, then the transaction locks the tracking row, re-reads the position
and applies only what is still beyond it.

What this process has just written need not be read back: ``follow`` applies it from
memory when it comes right after the view's position and keeps nothing sealed at rest
(ADR 0078); otherwise the view catches up from the log.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Sequence
from typing import Any, Protocol
from uuid import UUID

import attrs
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, Notification, Recording, StoredEvent
from eventsourcing.utils import get_topic

from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.domain.events import FIRST_VERSION
from gateway_ledger.infrastructure.eventstore.bulk_events import decode_each
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect, dialect_for
from gateway_ledger.infrastructure.eventstore.store import is_read_only
from gateway_ledger.infrastructure.privacy.private_mapper import DECODING_ERRORS, Undecodable
from gateway_ledger.infrastructure.views.fold import FoldFailed
from gateway_ledger.projections.rows import RowChange
from gateway_ledger.projections.view import DEFAULT_BATCH_SIZE, Progress

log = logging.getLogger("gateway_ledger.projections")


class RowSink(Protocol):
    """Where one batch's row changes go (a ``RowWriter``, or a ``RowFold``)."""

    def write(self, cursor: Cursor, change: RowChange) -> None: ...

    def finish(self, cursor: Cursor) -> None:
        """Write what was held back, before the view's position is written."""


class SqlProjection(Protocol):
    """A view kept in SQL tables: its tables, how one event changes them, how to empty
    them (``infrastructure/views/sql_view.py`` makes one from a pure projection)."""

    name: str
    """Plain identifier; the tracking table is ``<name>_tracking``."""
    topic_prefix: str
    """Notifications whose topic does not start with this are skipped undecoded (another
    application's events, in a shared table)."""
    reads_personal_data: bool
    """False: events are decoded without decryption (``PrivateMapper.sealed``): placeholders
    in their personal fields, no key read."""

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None: ...

    def batch(self, cursor: Cursor, dialect: SqlDialect, keys: Collection[str] | None) -> RowSink:
        """Where the changes of one batch go, in its transaction: folded in memory for the
        rows of ``keys`` the store does not have yet (None: nothing folded, each change
        written at once)."""

    def apply(self, cursor: Cursor, dialect: SqlDialect, event: Any, sink: RowSink) -> None:
        """Change the view for one decoded domain event (ignore what is not yours)."""

    def clear(self, cursor: Cursor, dialect: SqlDialect) -> None: ...

    def quarantine(
        self, cursor: Cursor, dialect: SqlDialect, bad: Undecodable, sink: RowSink
    ) -> None:
        """Record that the aggregate of ``bad`` has an event this view cannot read."""

    def prepare(self) -> None:
        """What must happen before the view's transaction (what would wait on its lock)."""


class _Refused(Exception):
    """The projection could not apply one decoded event: redo the batch without it."""

    def __init__(self, index: int, bad: Undecodable) -> None:
        self.index = index
        self.bad = bad


class _Gap(Exception):
    """The view's position is short of the events to apply: others' events come first."""


class ProjectionRunner:
    """Pulls an application's notifications into one projection; see the module docstring."""

    def __init__(self, app: Application[Any], projection: SqlProjection) -> None:
        self.app = app
        self.projection = projection
        self.dialect = dialect_for(app.recorder)
        self.tracking_table = self.dialect.table(f"{projection.name}_tracking")
        # A store opened read-only (a copy, another user's store) is read as it is: the
        # view answers from its tracked position and reports its lag, nothing is written.
        self.read_only = is_read_only(app.env)
        self.folds = True
        """Fold each batch's changes to the rows it creates (``fold.py``); False: one
        statement per change (the reference the fold is tested against)."""
        self._ready = False

    # -- tables -----------------------------------------------------------------------------

    def ensure_tables(self) -> None:
        """Create the view and its tracking row once per process (idempotent, cheap)."""
        if self._ready:
            return
        d = self.dialect
        if self.read_only:
            self._require_tables()
            self._ready = True
            return
        for attempt in range(3):
            try:
                self._create_tables(d)
                break
            except IntegrityError:
                # PostgreSQL: two processes ran CREATE TABLE IF NOT EXISTS at once.
                if attempt == 2:
                    raise
        self._ready = True

    def _require_tables(self) -> None:
        """A store opened read-only is read as it is; a view it never had cannot be built."""
        with self.dialect.read_cursor() as c:
            if self.dialect.name == "postgres":  # read-only: a store a newer release wrote
                c.execute("SELECT to_regclass(%s) IS NOT NULL AS n", (self.tracking_table,))
            else:
                c.execute(
                    "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (self.tracking_table,),
                )
            if int(c.fetchone()["n"]):
                return
        raise LedgerError(
            f"the {self.projection.name} view was never built in this store, which this "
            "process may only read (history and audit work; a writable copy builds it)"
        )

    def _create_tables(self, d: SqlDialect) -> None:
        with d.write_transaction() as c:
            c.execute(
                f"CREATE TABLE IF NOT EXISTS {self.tracking_table} ("
                "application_name TEXT PRIMARY KEY, notification_id BIGINT NOT NULL)"
            )
            c.execute(
                d.sql(
                    f"INSERT INTO {self.tracking_table} (application_name, notification_id) "
                    "VALUES (?, 0) ON CONFLICT (application_name) DO NOTHING"
                ),
                (self.app.name,),
            )
            self.projection.create_tables(c, d)

    # -- position ---------------------------------------------------------------------------

    def position(self) -> int:
        """The id of the last notification the view reflects (0: none)."""
        self.ensure_tables()
        with self.dialect.read_cursor() as c:
            return self._read_position(c)

    def _read_position(self, c: Cursor, *, lock: bool = False) -> int:
        c.execute(
            self.dialect.sql(
                f"SELECT notification_id FROM {self.tracking_table} WHERE application_name = ?"
                + (self.dialect.for_update if lock else "")
            ),
            (self.app.name,),
        )
        row = c.fetchone()
        return int(row["notification_id"]) if row else 0

    def lag(self) -> int:
        """How many notification ids the view is behind the log (an upper bound)."""
        newest = self.app.recorder.max_notification_id() or 0
        return max(0, newest - self.position())

    # -- catching up ------------------------------------------------------------------------

    def catch_up(
        self,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_batches: int | None = None,
        up_to: int | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Apply every notification after the tracked position (up to id ``up_to``, when
        given); returns how many applied (none on a store opened read-only: its lag is
        reported instead)."""
        self.ensure_tables()
        if self.read_only:
            return 0
        (applied,) = _follow(
            [self], batch_size, max_batches=max_batches, up_to=up_to, progress=progress
        )
        return applied

    @property
    def decoding(self) -> tuple[Any, str, bool]:
        """What decoding a batch for this view depends on: views alike in it can share
        one read and one decode of each batch (:func:`catch_up_together`)."""
        return self.app, self.projection.topic_prefix, self.projection.reads_personal_data

    def decode(self, notifications: Sequence[Notification]) -> list[tuple[int, Any]]:
        """This view's notifications among ``notifications``, decoded, with their ids (an
        event that does not decode stands as an ``Undecodable``)."""
        mapper = self.app.mapper
        # On SQLite several applications share one events table: decode only our topics.
        prefix = self.projection.topic_prefix
        sealed: Any = getattr(mapper, "sealed", None)
        if sealed is None or self.projection.reads_personal_data:
            sealed = contextlib.nullcontext
        ours = [n for n in notifications if n.topic.startswith(prefix)]
        with sealed():
            decoded = decode_each(self.app, ours)
        return [(n.id, event) for n, event in zip(ours, decoded, strict=True)]

    def apply_decoded(self, decoded: Sequence[tuple[int, Any]], last_id: int) -> tuple[int, int]:
        """Apply the decoded events still ahead of the position, and move the position to
        ``last_id``, atomically; returns how many applied and the position.

        An event that does not decode, or that the projection refuses (raises on it), goes
        to ``quarantine`` instead; a refusal rolls the batch back and redoes it so.
        """
        events = list(decoded)  # refusals are marked in this view's copy only
        self.projection.prepare()  # what must not write inside the view's transaction
        fold = self.folds
        while True:
            try:
                return self._apply_events(events, last_id, fold=fold)
            except _Refused as refused:
                nid, _ = events[refused.index]
                events[refused.index] = (nid, refused.bad)
            except FoldFailed as failed:
                # Not any one event's fault: the same batch, one statement per change,
                # where a refusal names its event (fold.py).
                log.info("projection %s: batch applied unfolded (%s)", self.projection.name, failed)
                fold = False

    def follow(self, written: Sequence[Recording[Any]]) -> int | None:
        """Apply the events this process has just written, as they are in memory, when
        they come right after the view's position (nothing else was written between
        them); returns how many applied, or None when they cannot be taken so (another
        writer's events came between, one of them keeps a field sealed at rest, which the
        view must see sealed, or the projection refused one) and nothing was written:
        the caller catches up from the log instead.

        The view then skips reading back and decoding what this process wrote; its
        change and its position still commit together, as a catch-up's do."""
        if self.read_only or not written:
            return None
        seals: Any = getattr(self.app.mapper, "seals", None)
        prefix = self.projection.topic_prefix
        first = written[0].notification.id
        events: list[tuple[int, Any]] = []
        for expected, recording in enumerate(written, start=first):
            notification = recording.notification
            event = recording.domain_event
            if notification.id != expected or (seals is not None and seals(type(event))):
                return None
            if notification.topic.startswith(prefix):
                events.append((expected, event))
        self.ensure_tables()
        self.projection.prepare()
        last_id = first + len(written) - 1
        try:
            applied, _ = self._apply_events(events, last_id, fold=self.folds, after=first - 1)
        except (_Gap, _Refused, FoldFailed):
            return None  # rolled back: nothing of it was written
        return applied

    def _apply_events(
        self, events: list[tuple[int, Any]], last_id: int, *, fold: bool, after: int | None = None
    ) -> tuple[int, int]:
        projection = self.projection
        refused = (*DECODING_ERRORS, *self.dialect.data_errors)
        with self.dialect.write_transaction() as c:
            current = self._read_position(c, lock=True)
            if after is not None and current < after:
                raise _Gap
            # A row the store lacks is folded; the rows a batch creates are those of the
            # aggregates it begins (their first event is in it), so only those are asked
            # for: a batch that begins none (a sweep's claims) asks nothing (fold.py).
            keys = (
                {
                    _key_of(e)
                    for nid, e in events
                    if nid > current and e.originator_version == FIRST_VERSION
                }
                if fold
                else None
            )
            sink = projection.batch(c, self.dialect, keys)
            todo = 0
            for index, (nid, event) in enumerate(events):
                if nid <= current:
                    continue
                todo += 1
                if isinstance(event, Undecodable):
                    log.error(
                        "projection %s: event v%d of %s quarantined (%s): %s",
                        projection.name,
                        event.originator_version,
                        event.originator_id,
                        event.reason.value,
                        event.detail,
                    )
                    projection.quarantine(c, self.dialect, event, sink)
                    continue
                try:
                    projection.apply(c, self.dialect, event, sink)
                except refused as e:
                    raise _Refused(index, _refused(event, e)) from e
            sink.finish(c)
            if last_id > current:
                c.execute(
                    self.dialect.sql(
                        f"UPDATE {self.tracking_table} SET notification_id = ? "
                        "WHERE application_name = ?"
                    ),
                    (last_id, self.app.name),
                )
        return todo, max(current, last_id)

    def rebuild(self, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Empty the view and replay the whole log into it: the view is only an index."""
        self.ensure_tables()
        with self.dialect.write_transaction() as c:
            self._read_position(c, lock=True)
            self.projection.clear(c, self.dialect)
            c.execute(
                self.dialect.sql(
                    f"UPDATE {self.tracking_table} SET notification_id = 0 "
                    "WHERE application_name = ?"
                ),
                (self.app.name,),
            )
        applied = self.catch_up(batch_size=batch_size)
        log.info("projection %s rebuilt from %d events", self.projection.name, applied)
        return applied


def catch_up_together(
    runners: Sequence[ProjectionRunner], *, batch_size: int = DEFAULT_BATCH_SIZE
) -> list[int]:
    """Catch several views up, reading and decoding each batch of the log once for all of
    them where they decode alike (one application, topics, decryption): each view still
    applies its part in a transaction of its own, with its own position. Returns how many
    events each applied, in the order given."""
    applied = [0] * len(runners)
    groups: dict[tuple[int, str, bool], list[int]] = {}
    for i, runner in enumerate(runners):
        app, prefix, personal = runner.decoding
        groups.setdefault((id(app), prefix, personal), []).append(i)
    for members in groups.values():
        alike = [runners[i] for i in members]
        for i, count in zip(members, _together(alike, batch_size), strict=True):
            applied[i] = count
    return applied


def _together(runners: list[ProjectionRunner], batch_size: int) -> list[int]:
    if any(r.read_only for r in runners):
        return [r.catch_up(batch_size=batch_size) for r in runners]
    for runner in runners:
        runner.ensure_tables()
    return _follow(runners, batch_size)


def _follow(
    runners: Sequence[ProjectionRunner],
    batch_size: int,
    *,
    max_batches: int | None = None,
    up_to: int | None = None,
    progress: Progress | None = None,
) -> list[int]:
    """The one catch-up loop: read each batch of the log after the views' positions once,
    decode it once (the views decode alike), and let each view apply what is still ahead
    of its own position. Up to id ``up_to``, when given; returns how many each applied."""
    started = time.perf_counter()
    positions = [r.position() for r in runners]
    applied = [0] * len(runners)
    position = min(positions)
    recorder = runners[0].app.recorder
    batches = 0
    while max_batches is None or batches < max_batches:
        if up_to is not None and position >= up_to:
            break
        notifications = recorder.select_notifications(
            position, batch_size, stop=up_to, inclusive_of_start=False
        )
        if not notifications:
            break
        decoded = runners[0].decode(notifications)
        last_id = notifications[-1].id
        for i, runner in enumerate(runners):
            if positions[i] < last_id:
                count, positions[i] = runner.apply_decoded(decoded, last_id)
                applied[i] += count
        # Each position is now at least ``last_id``: further, where another process
        # had applied more meanwhile.
        position = min(positions)
        batches += 1
        if progress is not None and up_to is not None:
            progress(position, up_to)
        if len(notifications) < batch_size:
            break
    for runner, count, at in zip(runners, applied, positions, strict=True):
        if count:
            log.debug(
                "projection %s applied %d events up to %d in %.1f ms",
                runner.projection.name,
                count,
                at,
                (time.perf_counter() - started) * 1000,
            )
    return applied


def _key_of(event: Any) -> str:
    """The row key of an event's aggregate in a view (its id as 32 hex digits)."""
    originator_id = event.originator_id
    return originator_id.hex if isinstance(originator_id, UUID) else str(originator_id)


def _refused(event: Any, error: BaseException) -> Undecodable:
    """A decoded event the projection (or the store) refused, as an ``Undecodable``."""
    stored = StoredEvent(
        originator_id=event.originator_id,
        originator_version=event.originator_version,
        topic=get_topic(type(event)),
        state=b"",
    )
    named = getattr(event, "obligation_id", None)
    if not (isinstance(named, str) and named.isprintable()):
        named = None
    return attrs.evolve(Undecodable.of(stored, error), obligation_id=named)
