"""The store's health and its copies: integrity checks, streams, online backup, restore.

Read-only checks run on the application's own datastore (the same connections its
commands use); the SQLite backup is SQLite's online backup API, page by page, so a
gateway writing meanwhile is held off only for a step at a time and the copy is one
consistent moment of the store (a file copy of a live WAL store is not).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.infrastructure.eventstore.sql_dialect import SqlDialect, dialect_for
from gateway_ledger.infrastructure.privacy.private_files import create_private_store_file

BACKUP_PAGES_PER_STEP = 256
"""Pages copied per step of the online backup; writers wait at most one step."""


class StoreChecks:
    """The checks ``verify`` runs on one application's events (SQLite or PostgreSQL)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.recorder = app.recorder
        self.dialect: SqlDialect = dialect_for(app.recorder)
        self.events_table = self.dialect.table(app.recorder.events_table_name)

    def integrity_problems(self) -> list[str]:
        """SQLite's ``PRAGMA integrity_check`` lines other than ``ok`` (none on PostgreSQL,
        whose pages are checksummed by the server)."""
        if self.dialect.name != "sqlite":
            return []
        with self.dialect.read_cursor() as c:
            c.execute("PRAGMA integrity_check")
            lines = [str(row[0]) for row in c.fetchall()]
        return [line for line in lines if line != "ok"]

    def broken_streams(self, limit: int = 20) -> list[tuple[str, int, int, int]]:
        """Streams whose versions are not 1..n without a gap: (id, count, first, last)."""
        with self.dialect.read_cursor() as c:
            c.execute(
                f"SELECT originator_id, COUNT(*) AS n, MIN(originator_version) AS first, "
                f"MAX(originator_version) AS last FROM {self.events_table} "
                "GROUP BY originator_id "
                "HAVING MIN(originator_version) <> 1 OR MAX(originator_version) <> COUNT(*) "
                f"LIMIT {int(limit)}"
            )
            return [
                (str(r["originator_id"]), int(r["n"]), int(r["first"]), int(r["last"]))
                for r in c.fetchall()
            ]

    def stored_events(self, page_size: int = 1000) -> Iterator[list[StoredEvent]]:
        """Every stored event of the application, a page at a time, in log order."""
        start = 0
        while True:
            page = self.recorder.select_notifications(start, page_size, inclusive_of_start=False)
            if page:
                yield [
                    StoredEvent(
                        originator_id=n.originator_id,
                        originator_version=n.originator_version,
                        topic=n.topic,
                        state=n.state,
                    )
                    for n in page
                ]
                start = page[-1].id
            if len(page) < page_size:
                return

    def stream(self, aggregate_id: UUID) -> list[StoredEvent]:
        return list(self.recorder.select_events(aggregate_id))


def backup_sqlite(
    source: str | Path,
    dest: str | Path,
    *,
    pages_per_step: int = BACKUP_PAGES_PER_STEP,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> int:
    """Copy the live SQLite store ``source`` to ``dest`` with SQLite's online backup.

    ``dest`` is created owner-only; an existing ``dest`` is refused unless ``overwrite``.
    The copy is written beside ``dest`` and renamed into place once complete, so a
    crash never leaves a half backup under its name. Returns the pages copied.
    """
    target = Path(dest)
    if target.exists() and not overwrite:
        raise InvalidInput(f"{target} exists; give another file (or --force)")
    if target.is_dir():
        raise InvalidInput(f"{target} is a directory; give a file name")
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    create_private_store_file(partial)
    copied = 0

    def step(status: int, remaining: int, total: int) -> None:
        nonlocal copied
        copied = total - remaining
        if progress is not None:
            progress(copied, total)
        time.sleep(0)  # let a waiting writer in between steps

    src = sqlite3.connect(str(source), timeout=10)
    try:
        out = sqlite3.connect(str(partial))
        try:
            src.backup(out, pages=pages_per_step, progress=step)
            out.execute("PRAGMA journal_mode=DELETE").fetchone()  # one self-contained file
        finally:
            out.close()
    finally:
        src.close()
    with partial.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, target)
    return copied


def restore_sqlite(backup: str | Path, dest: str | Path, *, overwrite: bool = False) -> int:
    """Restore a backup into ``dest`` (refused if a store is there, unless ``overwrite``):
    the same online copy the other way, then WAL mode as every store has."""
    source = Path(backup)
    if not source.is_file():
        raise InvalidInput(f"no backup at {source}")
    target = Path(dest)
    if target.exists() and not overwrite:
        raise InvalidInput(f"{target} exists; restore into a new file (or --force)")
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True) if overwrite else None
    pages = backup_sqlite(source, target, overwrite=overwrite)
    conn = sqlite3.connect(str(target))
    try:
        conn.execute("PRAGMA journal_mode=WAL").fetchone()
    finally:
        conn.close()
    return pages


def copy_companions(source: Path, dest: Path, names: Sequence[str]) -> list[Path]:
    """Copy the files beside ``source`` named ``<source><suffix>`` to ``<dest><suffix>``,
    owner-only (the master key, the session secret), where they exist."""
    written: list[Path] = []
    for suffix in names:
        origin = Path(f"{source}{suffix}")
        if not origin.exists():
            continue
        target = Path(f"{dest}{suffix}")
        create_private_store_file(target)
        target.write_bytes(origin.read_bytes())
        written.append(target)
    return written
