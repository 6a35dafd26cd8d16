"""What the session store needs from outside the application, as seams the composition root
fills (``gateway_ledger/bootstrap.py``): the application decides what a transcript holds,
infrastructure decides how it is written to a file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gateway_ledger.application.sessions.views import TranscriptMessage

DerivedSecret = Callable[[str], bytes]
"""A secret for one purpose (its label), derived from the store's master key: the inbound
ids of a raw-keys store are hashed under it, since such a store has no session secret."""


class TranscriptWriter(Protocol):
    """Writes one session's transcript as a file of ``directory`` named after the session."""

    def write_transcript(
        self, directory: Path, session_id: str, messages: Iterable[TranscriptMessage]
    ) -> Path:
        """Write ``messages`` in order; the file's path. ``session_id`` is a safe file name
        (the application checked it); the file holds personal data."""
        ...


class EventAppender(Protocol):
    """The write path without a ``Recording`` of each event (the composition root's sealed
    event store has it): for a bulk write, such as an import, that nobody is notified of."""

    def append(self, domain_events: Sequence[Any], **kwargs: Any) -> None: ...
