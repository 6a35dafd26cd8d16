"""A session's transcript: its ``MessageAppended`` events, read without replaying the session.

The messages are events of the ``Session`` aggregate, so the transcript is its history; the
aggregate keeps only counters. Reading pages through the events in either direction, so
``history(last=N)`` costs N messages whatever the conversation's length (ADR 0008).
Writing a transcript to a file is not done here: the application hands the messages to a
``TranscriptWriter`` (ports.py), which infrastructure implements.
"""

from __future__ import annotations

from collections.abc import Iterator
from uuid import UUID

from eventsourcing.persistence import EventStore

from gateway_ledger.application.sessions.views import TranscriptMessage
from gateway_ledger.domain.sessions.session import Session

PAGE = 500
"""Events read per query when the whole transcript is read."""


def message_of(e: Session.MessageAppended) -> TranscriptMessage:
    return TranscriptMessage(
        seq=e.seq,
        role=e.role,
        content=e.content,
        platform_message_id=e.platform_message_id,
        timestamp=e.timestamp,
    )


class TranscriptReader:
    """Reads the messages of sessions from an application's event store."""

    def __init__(self, events: EventStore[UUID]) -> None:
        self.events = events

    def messages(self, session: UUID) -> Iterator[TranscriptMessage]:
        """Every message of the session (by aggregate id), oldest first, a page at a time."""
        gt: int | None = None
        while True:
            page = list(self.events.get(session, gt=gt, limit=PAGE))
            for e in page:
                if isinstance(e, Session.MessageAppended):
                    yield message_of(e)
            if len(page) < PAGE:
                return
            gt = page[-1].originator_version

    def newest(self, session: UUID, last: int) -> list[TranscriptMessage]:
        """The newest ``last`` messages, oldest first, read backwards from the end."""
        found: list[TranscriptMessage] = []
        lte: int | None = None
        while len(found) < last:
            page = list(self.events.get(session, lte=lte, desc=True, limit=last - len(found) + 8))
            if not page:
                break
            found.extend(message_of(e) for e in page if isinstance(e, Session.MessageAppended))
            lte = page[-1].originator_version - 1
            if lte < 1:
                break
        found.reverse()
        return found[-last:] if last else []
