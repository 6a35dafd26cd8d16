"""Where the events live: turn a path (SQLite) into the eventsourcing environment.

SQLite is the default, embedded store. The same applications run on PostgreSQL when a
``postgresql://`` URL is given (see the multi-host ADR).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway_ledger.domain.errors import InvalidInput, LedgerError
from gateway_ledger.infrastructure.private_files import create_private_store_file

DEFAULT_BUSY_TIMEOUT_SECONDS = 10  # upstream's busy timeout; writers wait, never fail fast


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def sqlite_environment(
    path: str | Path, *, busy_timeout: int = DEFAULT_BUSY_TIMEOUT_SECONDS
) -> dict[str, str]:
    location = str(path)
    if not location or location == ":memory:":
        raise InvalidInput("the ledger needs a database file path (':memory:' loses everything)")
    db = Path(location)
    if db.is_dir():
        raise InvalidInput(f"{location} is a directory, not a database file")
    db.parent.mkdir(parents=True, exist_ok=True)
    # Owner-only from the first byte, whatever the umask; SQLite gives the -wal and -shm
    # files the database file's mode, so they are private too.
    create_private_store_file(db)
    ensure_wal(db, busy_timeout)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": str(db),
        "SQLITE_LOCK_TIMEOUT": str(busy_timeout),
    }


def ensure_wal(db: Path, busy_timeout: float) -> None:
    """Put the file in WAL mode before the library connects, waiting out other openers.

    The library switches a new file to WAL on connect, and that switch needs an exclusive
    lock that SQLite's busy handler does not always wait for: several processes opening
    a fresh file at once could get "database is locked". WAL is a property of the file,
    so once it is set here the library only reads it.
    """
    deadline = time.monotonic() + busy_timeout
    while True:
        conn = sqlite3.connect(db, timeout=busy_timeout)
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return  # WAL, or a file system without it: the library would get the same
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            if time.monotonic() >= deadline:
                raise LedgerError(f"{db} stayed locked for {busy_timeout} s") from None
        finally:
            conn.close()
        time.sleep(0.02)


@contextmanager
def opening(location: str | Path) -> Iterator[None]:
    """Hold while an application creates its tables: concurrent first opens must not race."""
    text = str(location)
    if not is_postgres_url(text):
        yield  # SQLite: WAL is set by ensure_wal; schema changes wait on the busy timeout
        return
    from gateway_ledger.infrastructure.postgres import creation_lock

    with creation_lock(text):
        yield


def store_environment(location: str | Path) -> dict[str, str]:
    text = str(location)
    if is_postgres_url(text):
        from gateway_ledger.infrastructure.postgres import postgres_environment

        return postgres_environment(text)
    return sqlite_environment(text)


def is_concurrent_ddl(error: BaseException) -> bool:
    """Two processes ran the library's CREATE OR REPLACE FUNCTION at once (first start of
    several gateways on a fresh PostgreSQL schema): harmless, the loser tries again."""
    return "tuple concurrently updated" in str(error) or "already exists" in str(error)
