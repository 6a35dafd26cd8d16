"""Erasure never holds the gateway's writers off (ADR 0028).

A long reader (a backup, a shell, a log shipper) keeps SQLite from truncating its WAL, and
an open transaction on the key table keeps PostgreSQL's ``VACUUM FULL`` from taking its
lock. ``sessions forget`` then leaves that cleanup pending, says so, and returns at once;
a writer in another process meanwhile waits about a second at most (the old code held
the write lock through 50 checkpoint tries of 10 s each, or waited for the VACUUM's lock
with no limit, every writer queued behind it). ``sessions forget --finish`` completes it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from privacy_support import store_bytes

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.privacy.key_table import KEYS_TABLE
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV

KEY = "agent:main:telegram:dm:5150"
CLI = str(Path(sys.executable).parent / "gateway-ledger")
CHILD = str(Path(__file__).with_name("erasure_writer_child.py"))
MAX_WRITER_WAIT = 3.0
"""A functional bound: the old code kept writers waiting 10 s and more."""


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ}
    )


def seed(location: str) -> bytes:
    """Replies of the session to forget and of a bystander; the forgotten key, wrapped."""
    ledger = DeliveryLedger.open(location)
    for n, key in enumerate([KEY, KEY, "agent:main:telegram:dm:bystander"]):
        ledger.record_obligation(
            obligation_id=f"o-seed-{n}", session_key=key, platform="telegram",
            chat_id="5150", content="hello",
        )  # fmt: skip
    ring = ledger.private_mapper.keyring
    (wrapped,) = [w for _, s, w in ring.table.rows() if s == ring.subject_id(KEY)]
    ledger.close()
    return wrapped


@contextmanager
def timed_writer(location: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A writer process writing throughout the block; its report lands in the dict."""
    stop = tmp_path / "stop-writer"
    child = subprocess.Popen(
        [sys.executable, CHILD, location, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    report: dict[str, Any] = {}
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        yield report
    finally:
        stop.touch()
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    report.update(json.loads(out.strip().splitlines()[-1]))


def forget_beside_a_blocker(
    location: str, tmp_path: Path, release: Callable[[], Any]
) -> tuple[subprocess.CompletedProcess[str], float, dict[str, Any]]:
    """Forget while the blocker is there and a writer writes; ``release`` the blocker if
    the forget does not return (so the writer can finish and report)."""
    with timed_writer(location, tmp_path) as writer:
        started = time.monotonic()
        try:
            done = cli("sessions", "forget", KEY, "--db", location)
        except subprocess.TimeoutExpired:
            release()
            raise
        took = time.monotonic() - started
        time.sleep(0.3)  # the writer goes on a little after the forget
    return done, took, writer


def test_a_long_reader_does_not_hold_writers_off_during_a_forget_on_sqlite(
    sqlite_location: str, tmp_path: Path
) -> None:
    wrapped = seed(sqlite_location)
    reader = sqlite3.connect(sqlite_location, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute(f"SELECT count(*) FROM {KEYS_TABLE}").fetchone()  # holds its snapshot

    done, took, writer = forget_beside_a_blocker(sqlite_location, tmp_path, reader.close)

    assert done.returncode == 0, done.stderr
    print(f"forget took {took:.2f} s; the writer's longest wait {writer['max_wait']:.3f} s")
    assert writer["errors"] == [] and writer["writes"] >= 2
    assert writer["max_wait"] < MAX_WRITER_WAIT
    assert "cleanup pending" in done.stdout and "--finish" in done.stdout
    still = cli("sessions", "forget", "--finish", "--db", sqlite_location)
    assert still.returncode == 1 and "pending" in still.stdout  # the reader is still there

    reader.execute("ROLLBACK")
    reader.close()
    finished = cli("sessions", "forget", "--finish", "--db", sqlite_location)
    assert finished.returncode == 0, finished.stderr
    assert "finished" in finished.stdout
    assert wrapped not in store_bytes(sqlite_location)
    assert cli("sessions", "forget", "--finish", "--db", sqlite_location).returncode == 0


def test_without_a_reader_the_forget_cleans_up_at_once_on_sqlite(sqlite_location: str) -> None:
    wrapped = seed(sqlite_location)
    done = cli("sessions", "forget", KEY, "--db", sqlite_location, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["cleanup_pending"], report["wal_truncated"]) == (False, True)
    assert wrapped not in store_bytes(sqlite_location)


def test_on_postgresql_vacuum_full_is_deferred_while_the_key_table_is_locked(
    pg_url: str, tmp_path: Path
) -> None:
    import psycopg

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    seed(pg_url)
    params = parse_postgres_url(pg_url)
    holder = connect(params)
    try:  # a failed assertion must not leave the lock for the schema's teardown to wait on
        holder.autocommit = False
        # An open transaction that has read the key table holds a lock VACUUM FULL waits for.
        holder.execute(
            psycopg.sql.SQL("SELECT count(*) FROM {}").format(
                psycopg.sql.Identifier(params["schema"], KEYS_TABLE)
            )
        ).fetchone()

        done, took, writer = forget_beside_a_blocker(pg_url, tmp_path, holder.close)

        assert done.returncode == 0, done.stderr
        print(f"forget took {took:.2f} s; the writer's longest wait {writer['max_wait']:.3f} s")
        assert writer["errors"] == [] and writer["writes"] >= 2
        assert writer["max_wait"] < MAX_WRITER_WAIT
        assert "cleanup pending" in done.stdout and "--finish" in done.stdout
    finally:
        holder.close()
    finished = cli("sessions", "forget", "--finish", "--db", pg_url)
    assert finished.returncode == 0, finished.stderr
    assert "finished" in finished.stdout
    ledger = DeliveryLedger.open(pg_url)
    ring = ledger.private_mapper.keyring
    assert all(s != ring.subject_id(KEY) for _, s, _ in ring.table.rows())
    ledger.close()
