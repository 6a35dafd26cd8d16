"""The vocabulary of privacy policies: which event fields are personal, which are clear.

An application declares, per event type, what it seals and what it stores in clear (see
``DELIVERY_PRIVACY`` and ``SESSION_PRIVACY`` in ``application/privacy/erasure.py``);
the sealing mapper in infrastructure reads these declarations. They are the port's
words: the application says what is personal, the infrastructure how it is sealed.
"""

from __future__ import annotations

from typing import Any

import attrs
from eventsourcing.utils import get_topic

from gateway_ledger.application.observability.causes import META
from gateway_ledger.domain.topics import topics_of


@attrs.frozen
class SealedEvent:
    """One event type's personal fields (``a`` or ``a.b`` for an attrs value's field).

    ``subject_from`` names the field that holds the session key on an aggregate's first
    event; later events of the aggregate inherit its subject. ``state_free``: the
    aggregate keeps none of these fields in its state (a transcript message), so loading
    the aggregate need not decrypt them (see ``PrivateMapper.state_only``). ``clear``:
    the event's other fields, stored in clear on purpose (a field in neither list fails
    the policy's completeness test, so a new field cannot slip through unsealed).
    ``dated_by_the_ledger``: the event's time is the ledger's clock, the clock an erasure
    dates its tombstone with, so one made before its subject's erasure is refused even
    when it is the first write after it (ADR 0071). Not for events dated by a caller or a
    platform (a message): after an erasure, those start new data.
    """

    event: type
    fields: tuple[str, ...]
    subject_from: str | None = None
    state_free: bool = False
    clear: tuple[str, ...] = ()
    dated_by_the_ledger: bool = False

    @property
    def topic(self) -> str:
        return get_topic(self.event)


@attrs.frozen
class InClear:
    """An event type that carries no personal data, and the fields it stores in clear.

    Declared like a :class:`SealedEvent`, so that every event type of an application is
    in its policy one way or the other (``PrivacyPolicy.unclassified``)."""

    event: type
    clear: tuple[str, ...] = ()

    @property
    def topic(self) -> str:
        return get_topic(self.event)


EVENT_BASE_FIELDS = frozenset(
    {"originator_id", "originator_version", "timestamp", "originator_topic"}
)
"""Fields every stored event has: ids, version, time, aggregate type; never personal."""


@attrs.frozen
class SealedSnapshot:
    """The personal attributes of an aggregate's state, sealed in its snapshots.

    A snapshot is a copy of state that events put there, so it holds the same personal
    data as they do; after erasure it shows the same placeholders as a replay would.
    """

    aggregate: type
    fields: tuple[str, ...]

    @property
    def topic(self) -> str:
        return get_topic(self.aggregate)


class PrivacyPolicy:
    """Which events carry personal data, and where; the rest is stored as is."""

    def __init__(self, *events: SealedEvent | SealedSnapshot | InClear) -> None:
        self.events = tuple(e for e in events if isinstance(e, SealedEvent))
        self.snapshots = tuple(e for e in events if isinstance(e, SealedSnapshot))
        self.in_clear = tuple(e for e in events if isinstance(e, InClear))
        # By every topic an event is stored under: a renamed class's former ones too.
        self.by_topic: dict[str, SealedEvent] = {
            t: e for e in self.events for t in topics_of(e.event)
        }
        self.snapshot_by_topic: dict[str, SealedSnapshot] = {s.topic: s for s in self.snapshots}
        self.clear_by_topic: dict[str, InClear] = {
            t: e for e in self.in_clear for t in topics_of(e.event)
        }

    def extended(self, *events: SealedEvent | SealedSnapshot | InClear) -> PrivacyPolicy:
        return PrivacyPolicy(*self.events, *self.snapshots, *self.in_clear, *events)

    def declares(self, event_class: type) -> bool:
        """Whether the policy says, one way or the other, what this event type holds."""
        topic = get_topic(event_class)
        return topic in self.by_topic or topic in self.clear_by_topic

    def unclassified(self, event: Any) -> list[str]:
        """The fields of a domain event that the policy neither seals nor declares clear
        (``a.b`` for a field of an attrs value of which only some fields are declared).
        An undeclared event type has all its fields unclassified."""
        topic = get_topic(type(event))
        sealed = self.by_topic.get(topic)
        declared = set(sealed.fields + sealed.clear) if sealed is not None else set()
        clear = self.clear_by_topic.get(topic)
        if clear is not None:
            declared |= set(clear.clear)
        missing: list[str] = []
        for name, value in vars(event).items():
            if name in EVENT_BASE_FIELDS or name in declared or name == META:
                continue
            nested = {p for p in declared if p.startswith(name + ".")}
            if nested and attrs.has(type(value)):
                missing += [
                    f"{name}.{f.name}"
                    for f in attrs.fields(type(value))
                    if f"{name}.{f.name}" not in nested
                ]
            else:
                missing.append(name)
        return missing

    @property
    def subject_topics(self) -> list[str]:
        return [e.topic for e in self.events if e.subject_from]
