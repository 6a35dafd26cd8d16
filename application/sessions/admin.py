"""Operators' read-only view of the session store: which sessions exist, what a key holds.

Nothing here writes: a store whose sessions were never used is reported empty instead of
being initialised, and the keying mode (keyed hashes or raw keys) is read from the store
so the right SessionStore is opened. Sources (user names and ids) are never shown.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import PersistenceError, Transcoder
from eventsourcing.utils import get_topic

from gateway_ledger.application.sessions.store import (
    RAW_KEYS_MODE,
    SESSIONS_APPLICATION_NAME,
    SessionStore,
    build_transcoder,
)
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.domain.sessions.route import SessionKeying, route_uuid
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.values import require_text
from gateway_ledger.infrastructure.eventstore.store import store_environment

_PAGE = 1000


class _Peek(Application[Any]):
    """Reads the sessions' keying record without creating anything."""

    name = SESSIONS_APPLICATION_NAME

    def construct_transcoder(self) -> Transcoder:
        return build_transcoder()


def open_session_store(location: str | Path) -> SessionStore | None:
    """The store's SessionStore, opened the way it was created; None if it has no sessions.

    Only an existing gateway-ledger store is opened, read-only when this process may not
    write it (``store_environment(existing=True)``)."""
    peek = _Peek(env={**store_environment(location, existing=True), "CREATE_TABLE": "n"})
    try:
        keying: Any = peek.repository.get(SessionKeying.create_id())
    except (AggregateNotFoundError, PersistenceError):
        return None  # no session in this store (on PostgreSQL: not even the sessions' table)
    finally:
        peek.close()
    raw_keys = str(keying.mode).startswith(RAW_KEYS_MODE)
    return SessionStore.open(location, raw_keys=raw_keys, existing=True)


@attrs.frozen
class SessionSummary:
    session_id: str
    key: str
    created_at: datetime
    previous_session_id: str | None
    started_reason: str | None
    ended: bool
    end_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        return data


def list_sessions(store: SessionStore) -> tuple[SessionSummary, ...]:
    """Every session, oldest first, from the log's Started and Reset events only."""
    started_topic = get_topic(Session.Started)
    reset_topic = get_topic(Session.Reset)
    found: dict[str, dict[str, Any]] = {}
    start = 0
    while True:
        page = store.recorder.select_notifications(
            start, _PAGE, topics=[started_topic, reset_topic], inclusive_of_start=False
        )
        for n in page:
            event: Any = store.mapper.to_domain_event(n)
            key = str(event.originator_id)
            if n.topic == started_topic:
                found[key] = {
                    "session_id": event.session_id,
                    "key": event.key,
                    "created_at": event.timestamp,
                    "previous_session_id": event.previous_session_id,
                    "started_reason": event.started_reason,
                    "ended": False,
                    "end_reason": None,
                }
            elif key in found:
                found[key].update(ended=True, end_reason=event.reason)
        if len(page) < _PAGE:
            break
        start = page[-1].id
    return tuple(SessionSummary(**v) for v in found.values())


@attrs.frozen
class SessionDetail:
    session_id: str
    created_at: datetime
    last_activity_at: datetime
    message_count: int
    ended: bool
    end_reason: str | None
    suspended: bool
    resume_pending: bool
    previous_session_id: str | None
    successor_session_id: str | None

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


def show_key(store: SessionStore, key: str, *, limit: int = 50) -> KeySessions:
    """The sessions of ``key``, following each one's predecessor from the current one."""
    require_text("key", key)
    try:
        route: Any = store.repository.get(route_uuid(key))
    except AggregateNotFoundError:
        raise NotFound("session key", key) from None
    sessions: list[SessionDetail] = []
    session_id: str | None = route.session_id
    while session_id and len(sessions) < limit:
        session = store._load_session(session_id)
        sessions.append(SessionDetail.of(session))
        session_id = session.previous_session_id
    return KeySessions(key=key, current_session_id=route.session_id, sessions=tuple(sessions))
