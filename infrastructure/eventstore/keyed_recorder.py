"""The library's recorders, storing new data keys in the transaction of their events.

Events sealed for a subject seen for the first time need its data key stored; writing the
key in the events' own transaction costs no write of its own and can never leave a sealed
event without its key (ADR 0017). The group-commit writer does that itself on SQLite; these
recorders do it for everything that goes through ``Application.save`` (the synchronous API,
the session store, operator commands, and on PostgreSQL the group-commit writer too),
chosen through the library's ``APPLICATION_RECORDER_TOPIC`` (``PrivateEvents.construct_env``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor

from gateway_ledger.infrastructure.privacy.key_table import insert_staged_keys, require_live_keys
from gateway_ledger.infrastructure.privacy.keyring import StagedKeys


class KeyStaging:
    """This thread's staged key rows (``KeyRing.writing_new_keys``), for the next insert."""

    stages_keys = True
    """False where the events' transaction cannot carry them (the caller then lets the key
    table write them first, on its own connection)."""

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

    def staged_rows(self) -> Sequence[tuple[Any, ...]]:
        staged: StagedKeys | None = getattr(self._staging, "keys", None)
        return staged.rows if staged is not None else ()

    def staged_used(self) -> dict[str, str]:
        """The stored keys (subject -> key id) this thread's events were sealed with."""
        staged: StagedKeys | None = getattr(self._staging, "keys", None)
        return staged.used if staged is not None else {}


class KeyedSQLiteApplicationRecorder(KeyStaging, SQLiteApplicationRecorder):
    """Inserts this thread's staged key rows before the events, then checks that the
    stored keys the events were sealed with are still there (ADR 0028).

    The check comes after the first write: the library opens a deferred ``BEGIN``, and a
    read first would make the write an upgrade that fails at once ("database is locked",
    no busy wait) whenever another connection committed in between. Once this connection
    writes it holds the write lock, so the check reads the latest state.
    """

    def _insert_events(
        self, c: SQLiteCursor, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        # KeyRaceLost or SessionErased: the library's transaction rolls back.
        rows = self.staged_rows()
        if rows:
            insert_staged_keys(c.sqlite_cursor, rows)
        ids = super()._insert_events(c, stored_events, **kwargs)
        require_live_keys(c.sqlite_cursor, self.staged_used())
        return ids
