"""Operators' read-only view of the session store: which sessions exist, what a key holds.

Nothing here writes. Which store to open, and how (the keying mode read from the store,
read-only when this process may not write it), is the composition root's
``open_session_store``. Sources (user names and ids) are never shown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs
from eventsourcing.utils import get_topic

from gateway_ledger.application.sessions.store import SessionsApplication
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.domain.sessions.retention import SessionTombstone
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.values import require_text

PAGE = 1000
PRUNED_KEY = "[pruned]"
"""A pruned session's key: its tombstone keeps no key (personal data in a raw-keys store)."""


@attrs.frozen
class SessionSummary:
    session_id: str
    key: str
    created_at: datetime
    previous_session_id: str | None
    started_reason: str | None
    ended: bool
    end_reason: str | None
    pruned: str | None = None
    """Where a pruned session's events went: its archive file, or ``deleted``."""

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        return data


def list_sessions(store: SessionsApplication) -> tuple[SessionSummary, ...]:
    """Every session, from the log's Started, Reset and Reopened events only, in the
    order they started; pruned ones (from their tombstones) before them."""
    started_topic = get_topic(Session.Started)
    reset_topic = get_topic(Session.Reset)
    reopened_topic = get_topic(Session.Reopened)
    found: dict[str, dict[str, Any]] = {}
    start = 0
    while True:
        page = store.recorder.select_notifications(
            start,
            PAGE,
            topics=[started_topic, reset_topic, reopened_topic],
            inclusive_of_start=False,
        )
        for n in page:
            event = store.mapper.to_domain_event(n)
            key = str(event.originator_id)
            if isinstance(event, Session.Started):
                found[key] = {
                    "session_id": event.session_id,
                    "key": event.key,
                    "created_at": event.timestamp,
                    "previous_session_id": event.previous_session_id,
                    "started_reason": event.started_reason,
                    "ended": False,
                    "end_reason": None,
                }
            elif isinstance(event, Session.Reset) and key in found:
                found[key].update(ended=True, end_reason=event.reason)
            elif isinstance(event, Session.Reopened) and key in found:
                found[key].update(ended=False, end_reason=None)  # switched back to
        if len(page) < PAGE:
            break
        start = page[-1].id
    pruned = tuple(
        SessionSummary(
            session_id=t.session_id,
            key=PRUNED_KEY,
            created_at=t.created_at,
            previous_session_id=None,
            started_reason=None,
            ended=True,
            end_reason=t.end_reason,
            pruned=pruned_to(t),
        )
        for t in store.pruned_sessions()
    )
    live = tuple(SessionSummary(**v) for v in found.values())
    # The pruned first, then the rest in the log's order, as every release listed them.
    return tuple(sorted(pruned, key=lambda s: (s.created_at, s.session_id))) + live


def pruned_to(stone: SessionTombstone) -> str:
    """Where a pruned session's events went, as the operator reads it."""
    return stone.archive or "deleted"


@attrs.frozen
class SessionDetail:
    session_id: str
    created_at: datetime
    last_activity_at: datetime
    message_count: int | None
    ended: bool
    end_reason: str | None
    suspended: bool
    resume_pending: bool
    previous_session_id: str | None
    successor_session_id: str | None
    pruned: str | None = None
    """Where a pruned session's events went (its archive file, or ``deleted``); its
    message count and successor are then unknown here."""

    @classmethod
    def of(cls, s: Session) -> SessionDetail:
        return cls(
            session_id=s.session_id,
            created_at=s.created_at,
            last_activity_at=s.last_activity_at,
            message_count=s.message_count,
            ended=s.ended,
            end_reason=s.end_reason,
            suspended=s.suspended,
            resume_pending=s.resume_pending,
            previous_session_id=s.previous_session_id,
            successor_session_id=s.successor_session_id,
        )

    @classmethod
    def of_pruned(cls, stone: SessionTombstone) -> SessionDetail:
        return cls(
            session_id=stone.session_id,
            created_at=stone.created_at,
            last_activity_at=stone.ended_at,
            message_count=None,
            ended=True,
            end_reason=stone.end_reason,
            suspended=False,
            resume_pending=False,
            previous_session_id=None,
            successor_session_id=None,
            pruned=pruned_to(stone),
        )

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["last_activity_at"] = self.last_activity_at.isoformat()
        return data


@attrs.frozen
class KeySessions:
    """A session key: its current session and the ones before it, newest first."""

    key: str
    current_session_id: str
    sessions: tuple[SessionDetail, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "current_session_id": self.current_session_id,
            "sessions": [s.to_dict() for s in self.sessions],
        }


def show_key(store: SessionsApplication, key: str, *, limit: int = 50) -> KeySessions:
    """The sessions of ``key``, newest first (every session its route has held); a pruned
    one from its tombstone."""
    require_text("key", key)
    route = store.route_of(key)
    if route is None:
        raise NotFound("session key", key)
    sessions: list[SessionDetail] = []
    for session_id in reversed(store.sessions_of(key)):
        if len(sessions) >= limit:
            break
        stone = store.session_tombstone(session_id)
        if stone is not None:
            sessions.append(SessionDetail.of_pruned(stone))
        else:
            sessions.append(SessionDetail.of(store.load_session(session_id)))
    return KeySessions(key=key, current_session_id=route.session_id, sessions=tuple(sessions))
