"""The library's SQLite recorder, storing new data keys in the transaction of their events.

Events sealed for a subject seen for the first time need its data key stored; writing the
key in the events' own transaction costs no write of its own and can never leave a sealed
event without its key (ADR 0017). The group-commit writer does that itself; this recorder
does it for everything else on SQLite (``Application.save``: the synchronous API, the
session store, operator commands), chosen through the library's
``APPLICATION_RECORDER_TOPIC`` (``PrivateEvents.construct_env``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor

from gateway_ledger.infrastructure.key_table import insert_staged_keys
from gateway_ledger.infrastructure.keyring import StagedKeys


class KeyedSQLiteApplicationRecorder(SQLiteApplicationRecorder):
    """Inserts this thread's staged key rows (``KeyRing.writing_new_keys``) before the events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._staging = threading.local()

    @contextlib.contextmanager
    def keys_from(self, staged: StagedKeys) -> Iterator[None]:
        """Within (on this thread): events inserted carry ``staged``'s new key rows along."""
        self._staging.keys = staged
        try:
            yield
        finally:
            self._staging.keys = None

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        staged: StagedKeys | None = getattr(self._staging, "keys", None)
        if staged is not None:  # KeyRaceLost: the library's transaction rolls back
            insert_staged_keys(c.sqlite_cursor, staged.rows)
        return super()._insert_events(c, stored_events, **kwargs)
