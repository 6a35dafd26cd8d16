"""Shared fixtures: one test body runs against every event store (SQLite and PostgreSQL).

PostgreSQL tests use the server on 127.0.0.1:5432 (database ``test``, trust auth). Where
none answers they are skipped with a printed reason, unless
``GATEWAY_LEDGER_REQUIRE_POSTGRES=1`` (set by .ci/run), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BASE_URL = os.environ.get(
    "GATEWAY_LEDGER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
REQUIRE_POSTGRES = os.environ.get("GATEWAY_LEDGER_REQUIRE_POSTGRES") == "1"

_pg_status: tuple[bool, str] | None = None


def postgres_available() -> tuple[bool, str]:
    global _pg_status
    if _pg_status is None:
        try:
            import psycopg

            from gateway_ledger.infrastructure.eventstore.postgres import (
                connect,
                parse_postgres_url,
            )

            with connect(parse_postgres_url(PG_BASE_URL)) as conn:
                conn.execute("SELECT 1")
            _pg_status = (True, "")
        except (ImportError, psycopg.Error, OSError) as e:  # type: ignore[name-defined]
            _pg_status = (False, f"PostgreSQL at {PG_BASE_URL} not reachable: {e}")
    return _pg_status


def require_postgres() -> None:
    ok, why = postgres_available()
    if not ok:
        if REQUIRE_POSTGRES:
            pytest.fail(f"GATEWAY_LEDGER_REQUIRE_POSTGRES=1 but {why}")
        pytest.skip(why)


def new_postgres_url() -> str:
    """A URL with a fresh schema, so tests never see each other's events."""
    return f"{PG_BASE_URL}?schema=t_{uuid.uuid4().hex[:12]}"


def drop_postgres_schema(url: str) -> None:
    from psycopg import sql

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    params = parse_postgres_url(url)
    with connect(params) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(params["schema"]))
        )


_started: weakref.WeakSet[object] = weakref.WeakSet()


@pytest.fixture(autouse=True)
def _close_what_the_test_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ledger a test started (``open``/``start``) is closed when the test ends, if
    the test left it open: its lease heartbeat stops and its lease is released. Nothing
    else starts a thread (constructors start nothing), so no heartbeat outlives a test."""
    from gateway_ledger.bootstrap import DeliveryLedger

    start = DeliveryLedger.start

    def tracked(ledger: DeliveryLedger) -> DeliveryLedger:
        _started.add(ledger)
        return start(ledger)

    monkeypatch.setattr(DeliveryLedger, "start", tracked)
    yield
    close_left_open()


def close_left_open() -> None:
    """Close the started ledgers that still hold a lease (the others hold no thread)."""
    for ledger in list(_started):
        if getattr(ledger, "heartbeat", None) is not None:
            ledger.close()  # type: ignore[attr-defined]
    _started.clear()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """The store kind under test; use ``store_location`` for a fresh, empty store."""
    if request.param == "postgres":
        require_postgres()
    return str(request.param)


@pytest.fixture
def store_location(backend: str, tmp_path: Path) -> Iterator[str]:
    """A location string accepted by every ``open()``: an SQLite file or a postgresql:// URL."""
    if backend == "sqlite":
        yield str(tmp_path / "ledger.db")
        return
    url = new_postgres_url()
    try:
        yield url
    finally:
        close_left_open()  # releases their leases while the schema still exists
        drop_postgres_schema(url)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL schema, for what only PostgreSQL has (required in CI)."""
    require_postgres()
    url = new_postgres_url()
    try:
        yield url
    finally:
        close_left_open()  # see store_location
        drop_postgres_schema(url)


@pytest.fixture
def sqlite_location(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.db")
