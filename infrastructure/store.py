"""Where the events live: turn a path (SQLite) into the eventsourcing environment.

SQLite is the default, embedded store. The same applications run on PostgreSQL when a
``postgresql://`` URL is given (see the multi-host ADR).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway_ledger.domain.errors import InvalidInput

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
    return {
        "PERSISTENCE_MODULE": "eventsourcing.sqlite",
        "SQLITE_DBNAME": str(db),
        "SQLITE_LOCK_TIMEOUT": str(busy_timeout),
    }


@contextmanager
def opening(location: str | Path) -> Iterator[None]:
    """Hold while an application creates its tables: concurrent first opens must not race."""
    text = str(location)
    if not is_postgres_url(text):
        yield  # SQLite serialises schema changes itself (busy timeout)
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
