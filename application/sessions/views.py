"""What the session store hands back: frozen snapshots, never live aggregates."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.domain.sessions.source import SessionSource


@attrs.frozen
class SessionContext:
    """The conversation a message belongs to, as decided by ``SessionStore.resolve``."""

    key: str
    session_id: str
    source: SessionSource
    created_at: datetime
    updated_at: datetime
    message_count: int
    is_new: bool
    auto_reset: bool
    reset_reason: str | None
    previous_session_id: str | None
    should_auto_continue: bool


@attrs.frozen
class TranscriptMessage:
    seq: int
    role: str
    content: str
    platform_message_id: str | None
    timestamp: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "platform_message_id": self.platform_message_id,
            "timestamp": self.timestamp.isoformat(),
        }


@attrs.frozen
class AppendResult:
    """Where a message landed. ``duplicate``: its platform id was taken before; nothing new
    was appended and ``session_id``/``seq`` point at the earlier message."""

    session_id: str
    seq: int
    duplicate: bool


@attrs.frozen
class SessionStatus:
    """A session as the store knows it now, and why: ``auto_reset_reason`` says why the
    session before it ended (``idle``, ``daily``, ``suspended``, ``resume_pending_expired``,
    ``session_reset``, ``session_switch``; None for a key's first session), ``resume_reason``
    why its turn is pending a resume. Upstream's ``SessionEntry`` flags, from the events."""

    key: str
    session_id: str
    created_at: datetime
    updated_at: datetime
    message_count: int
    suspended: bool
    resume_pending: bool
    resume_reason: str | None
    resume_marked_at: datetime | None
    was_auto_reset: bool
    auto_reset_reason: str | None
    previous_session_id: str | None
    ended: bool
    end_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for name in ("created_at", "updated_at", "resume_marked_at"):
            value = data[name]
            data[name] = None if value is None else value.isoformat()
        return data
