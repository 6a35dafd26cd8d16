"""The Session aggregate: one conversation, from its first message until it is reset.

Messages are events of the aggregate (``MessageAppended``), so the transcript is the
history itself. The aggregate's state keeps only counters and timestamps, never message
bodies: a snapshot stays small however long the conversation, and ``history(last=N)``
reads the newest N message events from the store without replaying the rest (ADR 0008).
"""

from __future__ import annotations

import re
from datetime import datetime
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.events import fields_set_once
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.topics import stored_as
from gateway_ledger.domain.values import (
    MAX_REASON_CHARS,
    require_aware,
    require_choice,
    require_clear_text,
    require_content,
    require_text,
)

SESSION_NAMESPACE = uuid5(NAMESPACE_URL, "https://gateway-ledger/session")
ROLES = frozenset({"user", "assistant", "system", "tool"})
_SESSION_ID_RE = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{8}$")
_HEX8_RE = re.compile(r"^[0-9a-f]{8}$")


def format_session_id(now: datetime, suffix: str) -> str:
    """Upstream's ``YYYYmmdd_HHMMSS_<8 hex>``; the caller supplies the randomness."""
    require_aware("now", now)
    if not isinstance(suffix, str) or not _HEX8_RE.match(suffix):
        raise InvalidInput("the session id suffix must be 8 lowercase hex characters")
    return f"{now.strftime('%Y%m%d_%H%M%S')}_{suffix}"


def is_session_id(value: object) -> bool:
    return isinstance(value, str) and bool(_SESSION_ID_RE.match(value))


def require_session_id(session_id: str) -> str:
    """``session_id`` if it has upstream's form, else refused by name."""
    if not is_session_id(session_id):
        raise InvalidInput(f"session_id {session_id!r} is not YYYYmmdd_HHMMSS_<8 hex>")
    return session_id


def session_uuid(session_id: str) -> UUID:
    return uuid5(SESSION_NAMESPACE, session_id)


@stored_as("gateway_ledger.domain.session")
@fields_set_once
class Session(Aggregate):
    """One conversation under one session key.

    Each command validates its input, checks the aggregate's invariants with a named guard
    (``check_...``) and triggers one event by calling the method its event class decorates;
    the event's method only mutates, since it runs again on every reload. The event classes
    are the stored record: their names and fields never change (``@stored_as``).
    """

    session_id: str
    key: str
    source: SessionSource
    created_at: datetime
    last_activity_at: datetime
    message_count: int
    previous_session_id: str | None
    started_reason: str | None
    resume_pending: bool
    resume_reason: str | None
    resume_marked_at: datetime | None
    suspended: bool
    ended: bool
    end_reason: str | None
    successor_session_id: str | None

    class Started(Aggregate.Created):
        """A conversation began under ``key``; after a reset, ``previous_session_id`` ended
        for ``started_reason``."""

        session_id: str
        key: str
        source: SessionSource
        previous_session_id: str | None
        started_reason: str | None

    class MessageAppended(Aggregate.Event):
        """One transcript message, numbered from 1 (``seq``) in its session."""

        seq: int
        role: str
        content: str
        platform_message_id: str | None

    class ResumeMarked(Aggregate.Event):
        """A turn was interrupted (``reason``: restart, shutdown, ...)."""

        reason: str

    class ResumeCleared(Aggregate.Event):
        """The interrupted turn needs no resuming any more."""

    class Suspended(Aggregate.Event):
        """``/stop``: the key's next message starts a fresh session."""

    class Reset(Aggregate.Event):
        """The session ended for ``reason``; its key continues in ``successor_session_id``."""

        reason: str
        successor_session_id: str

    class Reopened(Aggregate.Event):
        """An ended session became its key's current one again (``reason``: a switch back
        to it); it takes messages again."""

        reason: str

    @staticmethod
    def create_id(session_id: str) -> UUID:
        return session_uuid(session_id)

    # -- guards ---------------------------------------------------------------------------------

    def check_open(self, transition: str) -> None:
        """An ended session takes nothing more: its key continues in the successor."""
        if self.ended:
            raise IllegalTransition(
                "Session",
                self.session_id,
                f"ended ({self.end_reason})",
                transition,
                f"continued in {self.successor_session_id}",
            )

    # -- commands -------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        *,
        session_id: str,
        key: str,
        source: SessionSource,
        now: datetime,
        previous_session_id: str | None = None,
        reason: ResetReason | None = None,
    ) -> Session:
        session_id = require_session_id(session_id)
        require_text("session key", key)
        if not isinstance(source, SessionSource):
            raise InvalidInput("source must be a SessionSource")
        require_aware("now", now)
        return cls._create(
            cls.Started,
            session_id=session_id,
            key=key,
            source=source,
            previous_session_id=previous_session_id,
            started_reason=None
            if reason is None
            else require_choice("reset reason", reason, ResetReason).value,
            timestamp=now,
        )

    def append_message(
        self, *, role: str, content: str, now: datetime, platform_message_id: str | None = None
    ) -> int:
        """Append one message; returns its 1-based sequence number in this session."""
        require_aware("now", now)
        if role not in ROLES:
            raise InvalidInput(f"unknown role {role!r}; expected one of {sorted(ROLES)}")
        require_content("content", content)
        if platform_message_id is not None:
            require_text("platform_message_id", platform_message_id)
        self.check_open("append")
        seq = self.message_count + 1
        self._message_appended(
            seq=seq,
            role=role,
            content=content,
            platform_message_id=platform_message_id,
            timestamp=now,
        )
        return seq

    def mark_resume_pending(self, *, now: datetime, reason: str = "restart") -> None:
        """A turn was interrupted (shutdown, crash): continue it after the restart if fresh."""
        require_aware("now", now)
        require_clear_text("reason", reason, max_chars=MAX_REASON_CHARS)
        self.check_open("resume marked")
        self._resume_marked(reason=reason, timestamp=now)

    def clear_resume_pending(self, *, now: datetime) -> None:
        """Nothing pending: nothing recorded."""
        require_aware("now", now)
        if self.resume_pending:
            self._resume_cleared(timestamp=now)

    def suspend(self, *, now: datetime) -> None:
        """``/stop``: the next message starts a fresh session (reason ``suspended``).
        Suspending a suspended session records nothing."""
        require_aware("now", now)
        self.check_open("suspended")
        if not self.suspended:
            self._suspended(timestamp=now)

    def reset(self, *, reason: ResetReason, successor_session_id: str, now: datetime) -> None:
        """End this session; its key continues in ``successor_session_id``."""
        require_aware("now", now)
        reason = require_choice("reset reason", reason, ResetReason)
        if not is_session_id(successor_session_id) or successor_session_id == self.session_id:
            raise InvalidInput("the successor must be another valid session id")
        self.check_open(f"reset ({reason.value})")
        self._reset(reason=reason.value, successor_session_id=successor_session_id, timestamp=now)

    def reopen(self, *, reason: ResetReason, now: datetime) -> None:
        """Make an ended session current again (a switch back to it); an open session
        records nothing."""
        require_aware("now", now)
        reason = require_choice("reopen reason", reason, ResetReason)
        if self.ended:
            self._reopened(reason=reason.value, timestamp=now)

    # -- events (bodies only mutate) ------------------------------------------------------------

    @event(Started)
    def __init__(
        self,
        session_id: str,
        key: str,
        source: SessionSource,
        previous_session_id: str | None,
        started_reason: str | None,
        timestamp: datetime,
    ) -> None:
        self.session_id = session_id
        self.key = key
        self.source = source
        self.created_at = timestamp
        self.last_activity_at = timestamp
        self.message_count = 0
        self.previous_session_id = previous_session_id
        self.started_reason = started_reason
        self.resume_pending = False
        self.resume_reason = None
        self.resume_marked_at = None
        self.suspended = False
        self.ended = False
        self.end_reason = None
        self.successor_session_id = None

    @event(MessageAppended)
    def _message_appended(
        self,
        seq: int,
        role: str,
        content: str,
        platform_message_id: str | None,
        timestamp: datetime,
    ) -> None:
        self.message_count = seq
        self.last_activity_at = timestamp

    @event(ResumeMarked)
    def _resume_marked(self, reason: str, timestamp: datetime) -> None:
        self.resume_pending = True
        self.resume_reason = reason
        self.resume_marked_at = timestamp

    @event(ResumeCleared)
    def _resume_cleared(self, timestamp: datetime) -> None:
        self.resume_pending = False
        self.resume_reason = None

    @event(Suspended)
    def _suspended(self, timestamp: datetime) -> None:
        self.suspended = True

    @event(Reset)
    def _reset(self, reason: str, successor_session_id: str, timestamp: datetime) -> None:
        self.ended = True
        self.end_reason = reason
        self.successor_session_id = successor_session_id
        self.resume_pending = False

    @event(Reopened)
    def _reopened(self, reason: str, timestamp: datetime) -> None:
        self.ended = False
        self.suspended = False
        self.end_reason = None
        self.successor_session_id = None


MessageAppended = Session.MessageAppended
"""The event class of one transcript message (read by ``history`` without a replay)."""
