"""Exported transcripts as files: ``<directory>/<session_id>.jsonl``, one message a line.

A transcript is personal data, so it is written like every such file
(``infrastructure/privacy/private_files.py``): owner-only, through a temporary that never
follows a planted symlink and is removed if anything fails, then renamed into place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import orjson

from gateway_ledger.application.sessions.views import TranscriptMessage
from gateway_ledger.infrastructure.privacy.private_files import replace_private_file

log = logging.getLogger("gateway_ledger.sessions")


class JsonlTranscriptFiles:
    """The session store's ``TranscriptWriter`` (application/sessions/ports.py)."""

    def write_transcript(
        self, directory: Path, session_id: str, messages: Iterable[TranscriptMessage]
    ) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{session_id}.jsonl"
        count = replace_private_file(
            target, (orjson.dumps(message.to_dict()) + b"\n" for message in messages)
        )
        log.info("session %s exported: %d messages", session_id, count)
        return target
