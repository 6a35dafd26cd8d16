"""``history --correlation ID``: every event of one turn, in the ledger and the sessions.

The events that carry the correlation id in their metadata, and, in the ledger, every
other event of each obligation among them: a claim by a later sweep, an operator's retry
and the re-send that followed belong to the reply of that turn though their own cause
(and correlation) is the sweep or the command. A scan of the notification log: an id is
looked for in the stored bytes first, and only events that hold it are decoded (the
metadata is never sealed; ADR 0058).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from gateway_ledger.application.observability import causes

PAGE = 1000


@attrs.frozen
class CorrelatedEvent:
    store: str
    """``ledger`` or ``sessions``."""
    name: str
    """The obligation id, or the session id (the aggregate id when neither is known)."""
    position: int
    version: int
    type: str
    timestamp: datetime
    meta: dict[str, str]
    direct: bool
    """Carries the correlation id itself (else: another event of an obligation that does)."""

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["timestamp"] = self.timestamp.isoformat()
        return data


def _notifications(app: Any) -> Iterator[Any]:
    start = 0
    while True:
        page = app.recorder.select_notifications(start, PAGE, inclusive_of_start=False)
        yield from page
        if len(page) < PAGE:
            return
        start = page[-1].id


def _name(event: Any) -> str | None:
    for field in ("obligation_id", "session_id"):
        value = event.__dict__.get(field)
        if isinstance(value, str):
            return value
    return None


def correlated(
    stores: Sequence[tuple[str, Any, str]],
    correlation_id: str,
    *,
    whole_aggregates: Sequence[str],
) -> list[CorrelatedEvent]:
    """The events of ``correlation_id`` in each ``(name, application, module)``, in log
    order per store, where ``module`` names the package of the store's own event classes
    (stores may share one log); for the stores named in ``whole_aggregates``, every event
    of each aggregate that has one."""
    needle = correlation_id.encode()
    found: list[CorrelatedEvent] = []
    taken: set[tuple[int, str]] = set()
    for store, app, module in stores:
        hits: dict[int, tuple[Any, Any]] = {}
        aggregates: set[UUID] = set()

        def take(n: Any, app: Any = app, module: str = module) -> Any:
            """The event, if this store's own (stores may share one log); else None."""
            if (n.id, n.topic) in taken:
                return None
            try:
                event = app.mapper.to_domain_event(n)
            except Exception:  # another store's event type, or one this version cannot read
                return None
            if not type(event).__module__.startswith(module):
                return None
            taken.add((n.id, n.topic))
            return event

        for n in _notifications(app):
            if needle not in n.state:
                continue
            event = take(n)
            if event is not None and causes.of(event).get("correlation_id") == correlation_id:
                hits[n.id] = (n, event)
                aggregates.add(event.originator_id)
        if store in whole_aggregates and aggregates:
            for n in _notifications(app):
                if n.id not in hits and n.originator_id in aggregates:
                    event = take(n)
                    if event is not None:
                        hits[n.id] = (n, event)
        names: dict[Any, str] = {}
        for _, event in hits.values():
            name = _name(event)
            if name is not None:
                names.setdefault(event.originator_id, name)
        for position in sorted(hits):
            n, event = hits[position]
            meta = causes.of(event)
            found.append(
                CorrelatedEvent(
                    store=store,
                    name=names.get(event.originator_id, str(event.originator_id)),
                    position=position,
                    version=event.originator_version,
                    type=type(event).__name__,
                    timestamp=event.timestamp,
                    meta=meta,
                    direct=meta.get("correlation_id") == correlation_id,
                )
            )
    return found
