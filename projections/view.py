"""What a view of the event log is, apart from the store that keeps it.

A view is kept from the application's notification log: each event is turned into a
change of one row (a :class:`Projection`, pure: ``projections/<capability>/``), and the
store applies the changes together with the view's tracked position, in one transaction
(a :class:`MaterializedView`, implemented for SQLite and PostgreSQL in
``infrastructure/views/`` and chosen by the composition root). A crash before the commit
loses nothing, a crash after it repeats nothing, and a view can always be rebuilt from
the events: it is only an index.

One event a view cannot read (it does not decode, or the store refuses its values) never
stops the view: the projection says how the aggregate's row shows it (ADR 0027).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import attrs

from gateway_ledger.domain.values import QuarantineReason
from gateway_ledger.projections.rows import RowChange

if TYPE_CHECKING:  # a type only: the projections do not load the library's persistence
    from eventsourcing.persistence import Recording

DEFAULT_BATCH_SIZE = 500
"""Notifications read, decoded and applied per transaction."""

Progress = Callable[[int, int], None]
"""Called with (position reached, position aimed at) while a view is replayed."""


class Unreadable(Protocol):
    """An event a view cannot read: what is known of it without its content."""

    @property
    def originator_id(self) -> UUID: ...
    @property
    def originator_version(self) -> int: ...
    @property
    def reason(self) -> QuarantineReason: ...
    @property
    def obligation_id(self) -> str | None:
        """The id its own bytes still name, when the first event is the bad one."""


class Projection(Protocol):
    """How the events of the log change one view: pure, no store, no clock."""

    name: str
    """Plain identifier of the view (its table, and ``<name>_tracking``)."""

    topic_prefix: str
    """Only notifications whose topic starts with this are decoded (the log may hold
    other applications' events)."""

    reads_personal_data: bool
    """False: the events are decoded without opening their sealed fields (no data key is
    read, no personal text held; ADR 0021)."""

    def change(self, event: object) -> RowChange | None:
        """The change one decoded event makes (None: not this view's event)."""

    def quarantine(self, bad: Unreadable) -> RowChange:
        """The change that shows the aggregate of ``bad`` as quarantined from here on."""


@attrs.frozen
class ProjectionStatus:
    name: str
    position: int
    lag: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class RebuildReport:
    """A from-scratch rebuild compared with the incremental view at the same position."""

    name: str
    position: int
    events_replayed: int
    rows: int
    equal: bool
    differences: tuple[str, ...]
    repaired: bool
    elapsed_seconds: float

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["differences"] = list(self.differences)
        return data


MAX_DIFFERENCES = 50
"""Differences a rebuild report names (the count of rows is always complete)."""


def differences(
    live: Mapping[str, Mapping[str, Any]], rebuilt: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Where a rebuilt view's rows (by key) differ from the live view's, one line per row."""
    found = []
    for key in sorted(live.keys() | rebuilt.keys()):
        a, b = live.get(key), rebuilt.get(key)
        if a == b:
            continue
        if a is None or b is None:
            found.append(f"{key}: {'missing from' if a is None else 'only in'} the live view")
        else:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            found.append(f"{key}: differs in {', '.join(fields)}")
    return found


class MaterializedView(ABC):
    """A view kept current from the log, with its own tracked position (the port).

    Implementations commit every change with the position it brings the view to, and
    several processes may catch the same view up at once.
    """

    name: str

    @abstractmethod
    def catch_up(
        self, *, batch_size: int = DEFAULT_BATCH_SIZE, max_batches: int | None = None
    ) -> int:
        """Apply the notifications after the tracked position; how many were applied."""

    def follow(self, written: Sequence[Recording[Any]]) -> int:
        """Reflect events this process has just written (the library's ``Recording``s:
        each event with its notification), and anything before them; how many applied.
        A view that can take them from memory does (no read back, no decode); this one
        catches up from the log."""
        return self.catch_up()

    @abstractmethod
    def rebuild(self, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Empty the view and replay the whole log into it; how many were applied."""

    @abstractmethod
    def position(self) -> int:
        """The id of the last notification the view reflects (0: none)."""

    @abstractmethod
    def log_position(self) -> int:
        """The id of the newest notification in the log."""

    @abstractmethod
    def count(self) -> int:
        """Rows in the view."""

    @abstractmethod
    def rebuild_and_verify(
        self, *, batch_size: int = DEFAULT_BATCH_SIZE, progress: Progress | None = None
    ) -> RebuildReport:
        """Replay the log into a shadow copy up to the position this view reflects, and
        compare the two row by row; on a difference, rebuild this view from the events."""

    def lag(self) -> int:
        """How many notification ids the view is behind the log (an upper bound)."""
        return max(0, self.log_position() - self.position())

    def status(self) -> ProjectionStatus:
        position = self.position()
        lag = max(0, self.log_position() - position)
        return ProjectionStatus(self.name, position, lag, self.count())
