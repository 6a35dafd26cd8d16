"""Which release last wrote a store, and whether the running code is older (ADR 0054).

Every process that opens a store to write records its release in the small table
``gateway_ledger_store`` (name ``release``; the highest release stays). A process
opening a store that a newer release wrote reads the marker before the application is
built: a reader is opened read-only and says so, a writer is refused naming both
releases. Reading the marker creates nothing: the table is read through a read-only
connection (SQLite) or a plain query (PostgreSQL), and a store without it (written
before the marker existed) is older than every release that has it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.infrastructure.eventstore.sql_dialect import SqlDialect

STORE_TABLE = "gateway_ledger_store"
RELEASE = "release"


class NewerStore(LedgerError):
    """The store was written by a newer release than the running code: writing refused."""


THIS_RELEASE = "0.5.0"
"""This code's release: ``[project] version`` in pyproject.toml, which a test keeps equal.
Written here, not read from the installed package's metadata: a process that cannot read
the metadata (another user, a copied tree, a zipapp) would take itself for release 0 and
refuse to write every store."""


def running_release() -> str:
    """This code's release."""
    return THIS_RELEASE


def release_key(release: str) -> tuple[int, ...]:
    """``0.2.0`` -> (0, 2, 0); a part that is not a number counts as 0."""
    parts: list[int] = []
    for part in release.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def is_newer(stored: str | None, running: str) -> bool:
    return stored is not None and release_key(stored) > release_key(running)


def stored_release(env: Mapping[str, str], sqlite_path: str | None) -> str | None:
    """The release recorded in the store of ``env`` (None: no marker yet)."""
    if env.get("PERSISTENCE_MODULE") == "eventsourcing.postgres":
        from gateway_ledger.infrastructure.eventstore.postgres import (
            connect,
            environment_params,
        )

        schema = env.get("POSTGRES_SCHEMA", "public")
        with connect(environment_params(env)) as conn:
            exists = conn.execute(
                "SELECT to_regclass(%s)", (f'"{schema}"."{STORE_TABLE}"',)
            ).fetchone()
            if not exists or exists[0] is None:
                return None
            row = conn.execute(
                f'SELECT value FROM "{schema}"."{STORE_TABLE}" WHERE name = %s', (RELEASE,)
            ).fetchone()
        return None if row is None else str(row[0])
    if not sqlite_path or not Path(sqlite_path).exists():
        return None
    from gateway_ledger.infrastructure.eventstore.store import read_only_uri

    lite = sqlite3.connect(read_only_uri(Path(sqlite_path)), uri=True)
    try:
        found = lite.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name=?", (STORE_TABLE,)
        ).fetchone()
        if found is None:
            return None
        row = lite.execute(f"SELECT value FROM {STORE_TABLE} WHERE name=?", (RELEASE,)).fetchone()
    finally:
        lite.close()
    return None if row is None else str(row[0])


def record_release(dialect: SqlDialect, release: str) -> None:
    """Note ``release`` as the store's, unless a newer one is noted already."""
    table = dialect.table(STORE_TABLE)
    with dialect.write_transaction() as c:
        c.execute(f"CREATE TABLE IF NOT EXISTS {table} (name TEXT PRIMARY KEY, value TEXT)")
        c.execute(dialect.sql(f"SELECT value FROM {table} WHERE name = ?"), (RELEASE,))
        row = c.fetchone()
        current = None if row is None else str(row["value"])
        if current is None:
            c.execute(dialect.sql(f"INSERT INTO {table} VALUES (?, ?)"), (RELEASE, release))
        elif release_key(release) > release_key(current):
            c.execute(
                dialect.sql(f"UPDATE {table} SET value = ? WHERE name = ?"), (release, RELEASE)
            )


def newer_store_message(location: str, stored: str, running: str) -> str:
    return (
        f"{location} was written by gateway-ledger {stored}; this is {running}: "
        "writes are refused (upgrade to read and write it; read-only commands still work)"
    )


def checked_environment(
    location: str, env: dict[str, str], *, writes: bool
) -> tuple[dict[str, str], bool]:
    """The environment to open ``location`` with, after reading its release marker, and
    whether this process should record its release there (a writer on a store no newer).

    A store a newer release wrote: a writer is refused (``NewerStore`` naming both
    releases); a reader gets a read-only environment and a warning on the log.
    """
    import logging

    from gateway_ledger.infrastructure.eventstore.store import (
        is_read_only,
        read_only_environment,
        store_path,
    )

    running = running_release()
    stored = stored_release(env, store_path(env))
    if not is_newer(stored, running):
        return env, writes and not is_read_only(env)
    assert stored is not None
    message = newer_store_message(location, stored, running)
    if writes:
        raise NewerStore(message)
    logging.getLogger("gateway_ledger.store").warning("%s; opened read-only", message)
    return read_only_environment(location), False
