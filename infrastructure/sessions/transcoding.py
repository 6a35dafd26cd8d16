"""How the session store's events are encoded: the orjson transcoder (ADR 0004) with the
value objects every store knows, plus the one only sessions store, the ``SessionSource``."""

from __future__ import annotations

from typing import Any

from eventsourcing.persistence import Transcoder, Transcoding

from gateway_ledger.application.delivery.ledger import VALUE_OBJECTS
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.eventstore.transcoder import AttrsTranscoding, OrjsonTranscoder


class SessionSourceTranscoding(Transcoding):
    """Stores a SessionSource through ``to_dict``/``from_dict``: trust flags never reach disk."""

    type = SessionSource
    name = "SessionSource"

    def encode(self, obj: SessionSource) -> dict[str, Any]:
        return obj.to_dict()

    def decode(self, data: dict[str, Any]) -> SessionSource:
        return SessionSource.from_dict(data)


def build_session_transcoder() -> Transcoder:
    transcoder = OrjsonTranscoder()
    for cls in VALUE_OBJECTS:
        transcoder.register(AttrsTranscoding(cls))
    transcoder.register(SessionSourceTranscoding())
    return transcoder
