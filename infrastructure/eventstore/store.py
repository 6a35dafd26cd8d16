"""Where the events live: turn a path (SQLite) into the eventsourcing environment.

SQLite is the default, embedded store. The same applications run on PostgreSQL when a
``postgresql://`` URL is given (see the multi-host ADR).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from gateway_ledger.domain.errors import InvalidInput, LedgerError, NotAStore, ReadOnlyStore
from gateway_ledger.infrastructure.privacy.private_files import create_private_store_file

DEFAULT_BUSY_TIMEOUT_SECONDS = 10  # upstream's busy timeout; writers wait, never fail fast

READ_ONLY_ENV = "GATEWAY_LEDGER_READ_ONLY"
"""Set in an environment opened read-only: no table is created, no view catches up."""
STORE_PATH_ENV = "GATEWAY_LEDGER_STORE_PATH"
"""The SQLite file itself, when ``SQLITE_DBNAME`` is a read-only ``file:`` URI."""

SQLITE_HEADER = b"SQLite format 3\x00"
EVENTS_TABLE = "stored_events"  # the library's table on SQLite, for every application
OUR_TOPICS = "gateway_ledger."  # every event type of the ledger and the sessions


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
    from gateway_ledger.infrastructure.eventstore.postgres import creation_lock

    with creation_lock(text):
        yield


def store_environment(
    location: str | Path, *, existing: bool = False, writing: bool = False
) -> dict[str, str]:
    """The environment of the store at ``location``, created if needed; ``existing=True``
    (the operators' commands) opens only a gateway-ledger store that is already there."""
    if existing:
        return existing_store_environment(location, writing=writing)
    text = str(location)
    if is_postgres_url(text):
        from gateway_ledger.infrastructure.eventstore.postgres import postgres_environment

        return postgres_environment(text)
    return sqlite_environment(text)


def existing_store_environment(location: str | Path, *, writing: bool = False) -> dict[str, str]:
    """Open only an existing gateway-ledger store; read-only when this process cannot write it.

    Whatever else ``location`` names (nothing, a directory, another application's SQLite
    file, an empty or text file, a database that does not answer) is refused with
    ``NotAStore`` before anything is opened for writing: not a byte of it changes and no
    file is created beside it. A store this process may read but not write (a read-only
    copy, another user's store) is opened read-only, so reading commands work on it and
    its views report their lag instead of catching up; ``writing=True`` (a command that
    appends) refuses it with ``ReadOnlyStore`` instead.
    """
    text = str(location)
    if is_postgres_url(text):
        from gateway_ledger.infrastructure.eventstore.postgres import (
            postgres_environment,
            require_postgres_store,
        )

        require_postgres_store(text)
        return postgres_environment(text)
    db = Path(text)
    require_sqlite_store(db)
    if can_write(db):
        return sqlite_environment(db)
    if writing:
        raise ReadOnlyStore(f"{db} is read-only for this process; this command writes to it")
    return read_only_environment(db)


def read_only_environment(location: str | Path) -> dict[str, str]:
    """The environment of an existing store opened only to read it: no table is created,
    no view catches up (a store this process may not write, or one a newer release wrote)."""
    text = str(location)
    if is_postgres_url(text):
        from gateway_ledger.infrastructure.eventstore.postgres import postgres_environment

        return {**postgres_environment(text), "CREATE_TABLE": "n", READ_ONLY_ENV: "y"}
    db = Path(text)
    return {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": read_only_uri(db),
        "SQLITE_LOCK_TIMEOUT": str(DEFAULT_BUSY_TIMEOUT_SECONDS),
        "CREATE_TABLE": "n",
        READ_ONLY_ENV: "y",
        STORE_PATH_ENV: str(db),
    }


def require_sqlite_store(db: Path) -> None:
    """Refuse, reading only, a file that is not a gateway-ledger store.

    A store is an SQLite file with the library's events table, empty or holding this
    package's events. The file is read through a read-only connection (``immutable``
    when no ``-wal`` file exists, so no ``-shm`` is created either).
    """
    if not db.exists():
        raise NotAStore(f"no store at {db} (give --db PATH or set GATEWAY_LEDGER_DB)")
    if db.is_dir():
        raise NotAStore(f"{db} is a directory, not a gateway-ledger store")
    try:
        with db.open("rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise NotAStore(f"cannot read {db}: {e.strerror or e}") from None
    if header != SQLITE_HEADER:
        raise NotAStore(f"{db} is not a gateway-ledger store (not an SQLite database)")
    try:
        conn = sqlite3.connect(read_only_uri(db), uri=True)
        try:
            tables = {
                row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            first = (
                conn.execute(f"SELECT topic FROM {EVENTS_TABLE} ORDER BY rowid LIMIT 1").fetchone()
                if EVENTS_TABLE in tables
                else None
            )
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise NotAStore(f"{db} cannot be read as a gateway-ledger store: {e}") from None
    if EVENTS_TABLE not in tables or (
        first is not None and not str(first[0]).startswith(OUR_TOPICS)
    ):
        raise NotAStore(f"{db} is not a gateway-ledger store")


def read_only_uri(db: Path) -> str:
    """A URI that opens the file read-only; ``immutable`` when no writer has a ``-wal``
    open (nothing newer to read, and no ``-shm`` to create in a folder we may not write)."""
    uri = "file:" + quote(str(db.absolute())) + "?mode=ro"
    return uri if Path(f"{db}-wal").exists() else uri + "&immutable=1"


def can_write(db: Path) -> bool:
    """May this process write the store: the file, its folder (for ``-wal``/``-shm``) and
    whichever of those two exist."""
    companions = [Path(f"{db}{suffix}") for suffix in ("-wal", "-shm")]
    paths = [db, db.parent if str(db.parent) else Path("."), *(p for p in companions if p.exists())]
    return all(os.access(p, os.W_OK) for p in paths)


def is_read_only(env: Mapping[str, str] | object) -> bool:
    """True for an application environment opened by :func:`existing_store_environment`
    on a store this process may only read."""
    get = getattr(env, "get", None)
    return bool(get and str(get(READ_ONLY_ENV) or "").strip().lower() in ("y", "yes", "1"))


def store_path(env: Mapping[str, str] | object) -> str | None:
    """The SQLite file of an application environment (None on PostgreSQL)."""
    get = getattr(env, "get", None)
    if get is None:
        return None
    if is_read_only(env) and get(STORE_PATH_ENV):
        return str(get(STORE_PATH_ENV))
    return get("SQLITE_DBNAME") or None


def is_concurrent_ddl(error: BaseException) -> bool:
    """Two processes ran the library's CREATE OR REPLACE FUNCTION at once (first start of
    several gateways on a fresh PostgreSQL schema): harmless, the loser tries again."""
    return "tuple concurrently updated" in str(error) or "already exists" in str(error)
