"""Load many aggregates with one query instead of one query each.

The library's repository reads one aggregate per call, and on SQLite each call opens and
rolls back its own transaction, a fixed cost per call. A sweep that reloads a
hundred candidates pays that a hundred times; this reads their events in one statement
from the recorder's own table, decodes them with the application's mapper and replays
them with each event's own ``mutate``, exactly as the repository does. Tied to the
eventsourcing 9.5 table layout (originator_id, originator_version, topic, state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import attrs
from eventsourcing.application import Application
from eventsourcing.persistence import StoredEvent

from gateway_ledger.infrastructure.eventstore.sql_dialect import PostgresDialect, dialect_for
from gateway_ledger.infrastructure.privacy.private_mapper import (
    DECODING_ERRORS,
    Openings,
    Undecodable,
)

MAX_IDS_PER_QUERY = 500


def select_stored_events(
    app: Application[Any], ids: Sequence[UUID]
) -> dict[UUID, list[StoredEvent]]:
    """Every stored event of the given aggregates, in version order, keyed by id."""
    recorder: Any = app.recorder
    dialect = dialect_for(recorder)
    table = dialect.table(recorder.events_table_name)
    found: dict[UUID, list[StoredEvent]] = {}
    postgres = isinstance(dialect, PostgresDialect)
    for start in range(0, len(ids), MAX_IDS_PER_QUERY):
        chunk = list(ids[start : start + MAX_IDS_PER_QUERY])
        params: list[Any]
        asked: dict[Any, UUID] = {}  # SQLite's text id -> the UUID asked for: parsed once
        if postgres:
            where, params = "originator_id = ANY(%s)", [chunk]
        else:
            where = f"originator_id IN ({', '.join('?' * len(chunk))})"
            params = [i.hex for i in chunk]
            asked = dict(zip(params, chunk, strict=True))
        with dialect.read_cursor() as c:
            c.execute(
                f"SELECT originator_id, originator_version, topic, state FROM {table} "
                f"WHERE {where} ORDER BY originator_id, originator_version",
                params,
            )
            rows = c.fetchall()
        for row in rows:
            raw = row["originator_id"]
            originator_id = asked.get(raw) or (raw if isinstance(raw, UUID) else UUID(raw))
            found.setdefault(originator_id, []).append(
                StoredEvent(
                    originator_id=originator_id,
                    originator_version=row["originator_version"],
                    topic=row["topic"],
                    state=bytes(row["state"]),
                )
            )
    return found


def to_domain_events(app: Application[Any], stored: Sequence[StoredEvent]) -> list[Any]:
    """Decode many stored events; with the private mapper, their data keys in one read."""
    many = getattr(app.mapper, "to_domain_events", None)
    if many is not None:
        return list(many(stored))
    return [app.mapper.to_domain_event(s) for s in stored]


def load_aggregates(app: Application[Any], ids: Sequence[UUID]) -> dict[UUID, Any]:
    """The current state of each aggregate that exists, rebuilt from all its events."""
    found = select_stored_events(app, ids)
    events = iter(to_domain_events(app, [s for stored in found.values() for s in stored]))
    aggregates: dict[UUID, Any] = {}
    for originator_id, stored in found.items():
        aggregate = None
        for _ in stored:
            event: Any = next(events)
            aggregate = event.mutate(aggregate)
        if aggregate is not None:
            aggregates[originator_id] = aggregate
    return aggregates


def decode_each(app: Application[Any], stored: Sequence[StoredEvent]) -> list[Any]:
    """Decode many stored events, each on its own: one that does not decode comes back as
    an ``Undecodable`` in its place and never fails the others (ADR 0027)."""
    each = getattr(app.mapper, "decode_each", None)
    if each is not None:
        return list(each(stored))
    found: list[Any] = []
    for s in stored:
        try:
            found.append(app.mapper.to_domain_event(s))
        except DECODING_ERRORS as e:
            found.append(Undecodable.of(s, e))
    return found


@attrs.frozen
class Loaded:
    """Aggregates read for sending, each on its own (ADR 0027): those rebuilt, those that
    could not be (the first event that did not decode or apply), and what opening found."""

    aggregates: dict[UUID, Any]
    undecodable: dict[UUID, Undecodable]
    openings: Openings


def load_each(
    app: Application[Any], ids: Sequence[UUID], viewed: Mapping[UUID, int] | None = None
) -> Loaded:
    """The current state of each aggregate that exists, one bad event failing only its own.

    ``viewed``: the version a view shows of some of them. An aggregate whose events up to
    that version this process has just read for the view (the mapper's
    ``shared_history``, within ``sharing_parses``) is rebuilt from them, not read again:
    it is the aggregate as of that read, and a write made from it is fenced by its
    version like any other (a later event makes it fail, ADR 0080)."""
    seen = viewed or {}
    history: Any = getattr(app.mapper, "shared_history", None) if seen else None
    found: dict[UUID, list[StoredEvent]] = {}
    unread: list[UUID] = []
    for aggregate_id in ids:
        version = seen.get(aggregate_id)
        kept = history(aggregate_id, version) if history is not None and version else None
        if kept is None:
            unread.append(aggregate_id)
        else:
            found[aggregate_id] = kept
    if unread:
        found.update(select_stored_events(app, unread))
    flat = [s for stored in found.values() for s in stored]
    watching = getattr(app.mapper, "watching", None)
    with watching() if watching is not None else contextlib.nullcontext(Openings()) as openings:
        events = iter(decode_each(app, flat))
    aggregates: dict[UUID, Any] = {}
    undecodable: dict[UUID, Undecodable] = {}
    for originator_id, stored in found.items():
        aggregate = None
        for s in stored:
            event: Any = next(events)
            if originator_id in undecodable:
                continue
            if isinstance(event, Undecodable):
                undecodable[originator_id] = event
                continue
            try:
                aggregate = event.mutate(aggregate)
            except DECODING_ERRORS as e:
                undecodable[originator_id] = Undecodable.of(s, e)
        if aggregate is not None and originator_id not in undecodable:
            aggregates[originator_id] = aggregate
    return Loaded(aggregates, undecodable, openings)
