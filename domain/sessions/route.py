"""Small aggregates around sessions: the route of a key, inbound dedupe, the keying mode.

``SessionRoute`` answers "which session is current for this key". Its id is ``uuid5(key)``,
so two processes opening a brand-new key race on version 1 of the same aggregate: the store
accepts one, the other reloads and joins that session (ADR 0008). Work per message touches
one route, never an index of all sessions (reference §2 item 15).
"""

from __future__ import annotations

from datetime import datetime
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.domain.events import fields_set_once
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.sessions.session import require_session_id
from gateway_ledger.domain.topics import stored_as
from gateway_ledger.domain.values import (
    require_aware,
    require_choice,
    require_clear_text,
    require_text,
)

ROUTE_NAMESPACE = uuid5(NAMESPACE_URL, "https://gateway-ledger/session-route")
INBOUND_NAMESPACE = uuid5(NAMESPACE_URL, "https://gateway-ledger/inbound-message")
KEYING_ID = uuid5(NAMESPACE_URL, "https://gateway-ledger/session-keying")


def route_uuid(key: str) -> UUID:
    return uuid5(ROUTE_NAMESPACE, key)


def inbound_uuid(platform: str, chat_scope: str, platform_message_id: str) -> UUID:
    return uuid5(INBOUND_NAMESPACE, f"{platform}\x00{chat_scope}\x00{platform_message_id}")


@stored_as("gateway_ledger.domain.session_route")
@fields_set_once
class SessionRoute(Aggregate):
    """The current session of one session key."""

    key: str
    session_id: str
    opened_at: datetime
    rotations: int

    class Opened(Aggregate.Created):
        """The key's first session is ``session_id``."""

        key: str
        session_id: str

    class Rotated(Aggregate.Event):
        """The key moved from ``previous_session_id`` to ``session_id`` for ``reason``."""

        previous_session_id: str
        session_id: str
        reason: str

    @staticmethod
    def create_id(key: str) -> UUID:
        return route_uuid(key)

    # -- guards ---------------------------------------------------------------------------------

    def check_rotates_to(self, session_id: str) -> None:
        """A rotation goes to another session: the current one ended, so it cannot continue."""
        if session_id == self.session_id:
            raise IllegalTransition(
                "SessionRoute", self.key, f"at {self.session_id}", "rotated", "same session"
            )

    # -- commands -------------------------------------------------------------------------------

    @classmethod
    def open(cls, *, key: str, session_id: str, now: datetime) -> SessionRoute:
        require_text("session key", key)
        session_id = require_session_id(session_id)
        require_aware("now", now)
        return cls._create(cls.Opened, key=key, session_id=session_id, timestamp=now)

    def rotate(self, *, session_id: str, reason: ResetReason, now: datetime) -> None:
        require_aware("now", now)
        reason = require_choice("reset reason", reason, ResetReason)
        session_id = require_session_id(session_id)
        self.check_rotates_to(session_id)
        self._rotated(
            previous_session_id=self.session_id,
            session_id=session_id,
            reason=reason.value,
            timestamp=now,
        )

    # -- events (bodies only mutate) ------------------------------------------------------------

    @event(Opened)
    def __init__(self, key: str, session_id: str, timestamp: datetime) -> None:
        self.key = key
        self.session_id = session_id
        self.opened_at = timestamp
        self.rotations = 0

    @event(Rotated)
    def _rotated(
        self, previous_session_id: str, session_id: str, reason: str, timestamp: datetime
    ) -> None:
        self.session_id = session_id
        self.rotations += 1


@stored_as("gateway_ledger.domain.session_route")
@fields_set_once
class InboundMessage(Aggregate):
    """A platform message id already taken into a session: the same id never starts a second
    turn, across restarts. Created in the same transaction as the message it marks.

    ``chat_scope`` and ``platform_message_id`` are what the application passes: the
    SessionStore passes keyed hashes, so no raw platform id is stored (ADR 0013)."""

    platform: str
    platform_message_id: str
    session_id: str
    seq: int

    class Seen(Aggregate.Created):
        """Message ``platform_message_id`` of chat ``chat_scope`` is message ``seq`` of
        ``session_id``."""

        platform: str
        chat_scope: str
        platform_message_id: str
        session_id: str
        seq: int

    @staticmethod
    def create_id(platform: str, chat_scope: str, platform_message_id: str) -> UUID:
        return inbound_uuid(platform, chat_scope, platform_message_id)

    @classmethod
    def record(
        cls,
        *,
        platform: str,
        chat_scope: str,
        platform_message_id: str,
        session_id: str,
        seq: int,
        now: datetime,
    ) -> InboundMessage:
        require_clear_text("platform", platform)
        require_text("platform_message_id", platform_message_id)
        require_aware("now", now)
        return cls._create(
            cls.Seen,
            platform=platform,
            chat_scope=chat_scope,
            platform_message_id=platform_message_id,
            session_id=session_id,
            seq=seq,
            timestamp=now,
        )

    @event(Seen)
    def __init__(
        self,
        platform: str,
        chat_scope: str,
        platform_message_id: str,
        session_id: str,
        seq: int,
        timestamp: datetime,
    ) -> None:
        self.platform = platform
        self.platform_message_id = platform_message_id
        self.session_id = session_id
        self.seq = seq


@stored_as("gateway_ledger.domain.session_route")
@fields_set_once
class SessionKeying(Aggregate):
    """How this store's keys were made (``raw`` or ``keyed:<fingerprint>``), recorded once.

    Opening the store with another secret or mode would silently start a new session for
    every conversation; comparing against this record turns that into a clear error.
    """

    mode: str

    class Established(Aggregate.Created):
        """The store's keys are made in ``mode``."""

        mode: str

    @staticmethod
    def create_id() -> UUID:
        return KEYING_ID

    @classmethod
    def establish(cls, *, mode: str, now: datetime) -> SessionKeying:
        require_clear_text("keying mode", mode)
        require_aware("now", now)
        return cls._create(cls.Established, mode=mode, timestamp=now)

    @event(Established)
    def __init__(self, mode: str, timestamp: datetime) -> None:
        self.mode = mode
