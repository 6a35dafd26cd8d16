"""What every view of the obligations' events shares: dispatch, times, the quarantine rule.

Both views keep one row per obligation, keyed by the aggregate id, and both show an
obligation the ledger cannot read in the same way (ADR 0027). That rule lives here, once:

- a row records why and from which event version its obligation is quarantined
  (:data:`QUARANTINE_COLUMNS`; both NULL: it is not);
- an event this version cannot decode quarantines the row for good: whatever came after
  it is unknown, so later events no longer change the row. A ``Quarantined`` fact (sealed
  fields that fail authentication, :data:`STILL_READ_REASON`) is different: its events
  still read, so the obligation may still be abandoned;
- a row first seen through a bad event is made from the view's placeholders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from eventsourcing.utils import get_topic

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import QUARANTINED, QuarantineReason
from gateway_ledger.projections.rows import (
    NO_RELATIVE,
    Relative,
    RowChange,
    Update,
    Upsert,
    Value,
)
from gateway_ledger.projections.view import Unreadable

QUARANTINE_COLUMNS = ("quarantine_reason", "quarantine_version")
"""Why and at which event version an obligation is quarantined (NULL: it is not)."""

STILL_READ_REASON = QuarantineReason.UNREADABLE
"""The one quarantine under which later events still change a row: a row quarantined for
any other reason (an event that did not decode) keeps its quarantine whatever comes after
(a transition in between is unknown)."""


def still_read(quarantine_reason: Value) -> bool:
    """Does a row whose ``quarantine_reason`` column holds this still take changes? (The
    rule above, for a row held in memory; the SQL form is the views' guard.)"""
    return quarantine_reason is None or quarantine_reason == STILL_READ_REASON.value


KEY = "aggregate_id"
"""The column every obligation view is keyed by: the aggregate id, as 32 hex digits."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch: exact and sortable."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """``to_micros`` undone, exactly: a timedelta times an integer is integer arithmetic,
    and needs no keyword call per value (every view row read has two or more times)."""
    return _EPOCH + _MICROSECOND * int(value)


Handler = Callable[[Any, Any], RowChange]
"""A projection's method for one event class (the table maps classes to methods)."""


class ObligationProjection:
    """A projection of ``DeliveryObligation`` events, one row per obligation.

    Subclasses map each event class they read to a method (``handlers``); any other event
    of an obligation (a type added later, or one with no column of its own here) is an
    :meth:`update` with nothing but the row's version and time (so a row never claims to
    be newer than it is) and what the view's ``update`` adds to every change.
    """

    topic_prefix = get_topic(DeliveryObligation) + "."  # the store may hold other apps' events
    reads_personal_data = False
    """The obligation views read states, owners and times, never a personal field: their
    events are decoded without decrypting them (ADR 0021)."""

    handlers: ClassVar[Mapping[type, Handler]] = {}
    placeholders: ClassVar[Mapping[str, Value]] = {}
    """The columns of a row first seen through a bad event (besides its id, state, version
    and quarantine): what its events would have said is unknown."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._dispatch: dict[type, Handler] = dict(self.handlers)

    def change(self, event: object) -> RowChange | None:
        handler = self._dispatch.get(type(event))
        if handler is None:
            if not isinstance(event, DeliveryObligation.Event):
                return None  # another aggregate's event: not ours to index
            handler = self._handler_of(type(event))
        return handler(self, event)

    def _handler_of(self, cls: type) -> Handler:
        """The handler of the nearest class this view reads, else ``moved``; remembered."""
        found: Handler = type(self).moved
        for base in cls.__mro__:
            if base in self.handlers:
                found = self.handlers[base]
                break
        self._dispatch[cls] = found
        return found

    # -- what every obligation view does alike ----------------------------------------------

    def moved(self, event: DeliveryObligation.Event) -> RowChange:
        """An event that changes nothing this view shows but the row's version and time."""
        return self.update(event, {})

    def update(
        self,
        event: DeliveryObligation.Event,
        values: dict[str, Value],
        relative: Mapping[str, Relative] = NO_RELATIVE,
        *,
        moment: int | None = None,
    ) -> Update:
        """A change of the existing row: it always takes the event's time (``moment``,
        when the caller has it already) and version."""
        values["last_transition_at"] = to_micros(event.timestamp) if moment is None else moment
        values["version"] = event.originator_version
        return Update(event.originator_id.hex, values, relative)

    @staticmethod
    def quarantined(event: DeliveryObligation.Quarantined) -> dict[str, Value]:
        """What a ``Quarantined`` fact shows: never claimable, still owed (the row stays)."""
        return {
            "state": QUARANTINED,
            "quarantine_reason": QuarantineReason(event.reason).value,
            "quarantine_version": int(event.found_at),
        }

    def quarantine(self, bad: Unreadable) -> RowChange:
        """The aggregate of ``bad`` is quarantined from here on: its row says so, or a row
        is made for it (its first event is the bad one, or it had left this view)."""
        values: dict[str, Value] = {
            "obligation_id": bad.obligation_id or bad.originator_id.hex,
            **self.placeholders,
            "state": QUARANTINED,
            "quarantine_reason": bad.reason.value,
            "quarantine_version": bad.originator_version,
            "version": bad.originator_version,
        }
        return Upsert(
            bad.originator_id.hex,
            values,
            replace=("state", "quarantine_reason", "quarantine_version", "version"),
        )
