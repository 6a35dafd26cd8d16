"""Shared by the privacy tests: everything a store holds at rest, as bytes to scan."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def store_bytes(location: str, *apps: Any) -> bytes:
    """Everything at rest: SQLite's files, or every row of every table of the schema."""
    for app in apps:
        app.close()
    if not location.startswith("postgresql://"):
        return b"".join(
            Path(location + suffix).read_bytes()
            for suffix in ("", "-wal", "-shm")
            if Path(location + suffix).exists()
        )
    from psycopg import sql

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    params = parse_postgres_url(location)
    chunks: list[bytes] = []
    with connect(params) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema=%s",
                (params["schema"],),
            )
        ]
        assert "gateway_ledger_events" in tables or "gateway_sessions_events" in tables
        for table in tables:
            for row in conn.execute(
                sql.SQL("SELECT * FROM {}").format(sql.Identifier(params["schema"], table))
            ):
                for value in row:
                    chunks.append(value if isinstance(value, bytes) else str(value).encode())
    return b"\n".join(chunks)
