"""Conversations brought from an existing installation, as the events they would have made.

What an installation knows of one session key (its sessions oldest first, their messages
in order with their original times, the flags of the current one) arrives as an
:class:`ImportedKey`, already read and converted to aware times (the reader is
``infrastructure/importing/hermes.py``). :func:`key_aggregates` turns it into the
aggregates the live store would hold: the key's route, its sessions with their messages
and resets, the resume and suspend marks, and the inbound-id marks of the newest user messages (so
a platform that redelivers a message after the switch starts no second turn). The store
saves one key's aggregates in one transaction: a key is imported whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import attrs
from eventsourcing.domain import Aggregate

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.sessions.route import InboundMessage, SessionRoute
from gateway_ledger.domain.sessions.session import ROLES, Session
from gateway_ledger.domain.sessions.source import SessionSource

InboundIds = Callable[[str, str], tuple[str, str]]
"""(chat id, platform message id) -> the keyed hashes the store remembers them by."""

MARKED_INBOUND = 5
"""The newest user messages of a key's current session whose platform ids are marked as
taken: a platform redelivers what it did not see acknowledged before the switch, which
is the newest; marking a whole history would double the import's events for nothing."""


@attrs.frozen
class ImportedMessage:
    role: str
    content: str
    timestamp: datetime
    platform_message_id: str | None = None


@attrs.frozen
class ImportedSession:
    """One session; ``end_reason``: why it ended (upstream's ``end_reason``), for every
    session of a key but the current one."""

    session_id: str
    source: SessionSource
    created_at: datetime
    messages: tuple[ImportedMessage, ...] = ()
    end_reason: str | None = None


@attrs.frozen
class ImportedKey:
    """A session key as upstream's routing index holds it, its sessions oldest first (the
    last one is current)."""

    key: str
    sessions: tuple[ImportedSession, ...]
    suspended: bool = False
    resume_pending: bool = False
    resume_reason: str | None = None
    resume_marked_at: datetime | None = None
    updated_at: datetime | None = None
    origin: tuple[str, str] = ("", "")
    """Where the reader found it (file, position): what a report names instead of the key."""

    @property
    def current(self) -> ImportedSession:
        return self.sessions[-1]

    @property
    def message_count(self) -> int:
        return sum(len(s.messages) for s in self.sessions)


def reset_reason_of(end_reason: str | None) -> ResetReason:
    """Upstream's end reasons that are ours keep their name; any other (``compression``,
    ``branched``, ``agent_close``, ...) ended the session by hand as far as a key knows."""
    try:
        return ResetReason(end_reason or ResetReason.SESSION_RESET.value)
    except ValueError:
        return ResetReason.SESSION_RESET


def key_aggregates(imported: ImportedKey, key: str, inbound_ids: InboundIds) -> list[Aggregate]:
    """The aggregates ``imported`` becomes under ``key`` (the store's key for it: upstream's
    raw key, or the keyed hash of the current source). Raises InvalidInput on anything a
    live store would refuse, before anything is saved."""
    if not imported.sessions:
        raise InvalidInput(f"key {imported.key!r} has no session to import")
    built: list[Session] = []
    inbound: list[tuple[ImportedMessage, int]] = []
    route: SessionRoute | None = None
    previous: Session | None = None
    previous_end: str | None = None
    newest = imported.current
    for item in imported.sessions:
        reason = None if previous is None else reset_reason_of(previous_end)
        session = Session.start(
            session_id=item.session_id,
            key=key,
            source=item.source,
            now=item.created_at,
            previous_session_id=None if previous is None else previous.session_id,
            reason=reason,
        )
        for message in item.messages:
            if message.role not in ROLES:
                continue  # upstream's session_meta and other bookkeeping rows
            seq = session.append_message(
                role=message.role,
                content=message.content,
                now=message.timestamp,
                platform_message_id=message.platform_message_id,
            )
            if message.platform_message_id and message.role == "user" and item is newest:
                inbound.append((message, seq))
        if previous is None:
            route = SessionRoute.open(key=key, session_id=session.session_id, now=item.created_at)
        else:
            assert route is not None and reason is not None
            previous.reset(
                reason=reason, successor_session_id=session.session_id, now=item.created_at
            )
            route.rotate(session_id=session.session_id, reason=reason, now=item.created_at)
        built.append(session)
        previous, previous_end = session, item.end_reason
    current = built[-1]
    marked_at = imported.resume_marked_at or imported.updated_at or current.last_activity_at
    if imported.resume_pending:
        current.mark_resume_pending(now=marked_at, reason=imported.resume_reason or "restart")
    if imported.suspended:
        current.suspend(now=imported.updated_at or current.last_activity_at)
    assert route is not None
    # The newest first: a platform message id seen twice (upstream kept both rows) is marked
    # at its later message.
    marks: dict[object, Aggregate] = {}
    for message, seq in reversed(inbound[-MARKED_INBOUND:]):
        assert message.platform_message_id is not None
        chat_ref, message_ref = inbound_ids(current.source.chat_id, message.platform_message_id)
        mark = InboundMessage.record(
            platform=current.source.platform,
            chat_scope=chat_ref,
            platform_message_id=message_ref,
            session_id=current.session_id,
            seq=seq,
            now=message.timestamp,
        )
        marks.setdefault(mark.id, mark)
    return [route, *built, *marks.values()]
