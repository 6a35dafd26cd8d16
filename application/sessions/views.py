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
