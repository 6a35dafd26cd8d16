"""Issue 14: a gateway that cannot record says so, and counts what it sends untracked.

A wrong or missing master key, or a store that refuses writes, opened and read fine: the
gateway started without a word and every reply then went out untracked, one warning each.
A record write that failed after the deadline was not counted at all, and a second record
of one id with other content was taken for "already recorded" and never sent.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.values import MediaItem
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from gateway_ledger.infrastructure.eventstore.store import store_environment
from gateway_ledger.infrastructure.ownership.leases import LEASES_ENV
from gateway_ledger.infrastructure.privacy.master_key import KEY_FILE_ENV, MASTER_KEY_ENV
from tests.conftest import close_left_open
from tests.gateway_fakes import ScriptedAdapter
from tests.gateway_support import CTX, KEY, deliver_one


def key_b64(byte: bytes) -> str:
    return base64.b64encode(byte * 32).decode()


async def start_and_deliver(location: str, caplog: Any) -> tuple[Any, Any, Any, ScriptedAdapter]:
    adapter = ScriptedAdapter()
    caplog.clear()
    async with Gateway.open(location) as gw:
        report = await gw.start([adapter])
        out = await gw.deliver(CTX, Reply("second"), "in-1")
        await gw.flush()
        stats = gw.stats()
    return report, out, stats, adapter


def assert_said_and_counted(report: Any, out: Any, stats: Any, adapter: Any, caplog: Any) -> None:
    assert report.ledger_available is False and report.ledger_problem
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("ledger unavailable" in r.getMessage() for r in errors)
    assert all("second" not in r.getMessage() for r in caplog.records)  # ids, never bodies
    # The reply still went out, once, and it is counted as untracked.
    assert out.status == "delivered" and out.ledger_fault
    assert [s.content for s in adapter.sent] == ["second"]
    assert stats.untracked == 1
    assert stats.ledger_faults >= 2  # the start check, then the reply's record


def test_a_wrong_master_key_is_said_at_start_and_replies_are_counted_untracked(
    store_location: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(MASTER_KEY_ENV, key_b64(b"A"))
    asyncio.run(deliver_one(store_location))
    monkeypatch.setenv(MASTER_KEY_ENV, key_b64(b"B"))
    caplog.set_level(logging.INFO, logger="gateway_ledger")
    report, out, stats, adapter = asyncio.run(start_and_deliver(store_location, caplog))
    assert_said_and_counted(report, out, stats, adapter, caplog)
    assert "MasterKeyMismatch" in report.ledger_problem
    monkeypatch.setenv(MASTER_KEY_ENV, key_b64(b"A"))
    oid = compute_obligation_id(KEY, "in-1", "second")
    assert not DeliveryLedger.open(store_location).exists(oid)


def test_a_missing_master_key_file_is_said_at_start(
    store_location: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key_file = tmp_path / "keys" / "master.key"
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(key_file))
    asyncio.run(deliver_one(store_location))
    shutil.move(key_file, tmp_path / "elsewhere.key")  # the operator lost it
    caplog.set_level(logging.INFO, logger="gateway_ledger")
    report, out, stats, adapter = asyncio.run(start_and_deliver(store_location, caplog))
    assert_said_and_counted(report, out, stats, adapter, caplog)


@contextmanager
def owned_store(location: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """The store as a location, and a way to make it unwritable for this process.

    Tests run as root. SQLite: the database file made immutable (``chattr +i``: root
    cannot write it either; a plain chmod where we are not root). PostgreSQL: the store
    is created by a role of its own (which then owns it, and opens it as usual), whose
    INSERT, UPDATE and DELETE rights are then revoked.
    """
    if not location.startswith("postgres"):
        db = Path(location)
        root = os.geteuid() == 0

        def freeze() -> None:
            if root:
                subprocess.run(["chattr", "+i", str(db)], check=True)
            else:
                db.chmod(0o444)

        try:
            yield location, freeze
        finally:
            if root:
                subprocess.run(["chattr", "-i", str(db)], check=True)
            else:
                db.chmod(0o644)
        return
    params = parse_postgres_url(location)
    schema = params["schema"]
    role = f"h14_ro_{uuid.uuid4().hex[:8]}"
    with connect(params) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")

        def revoke() -> None:
            admin.execute(
                f'REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" FROM {role}'
            )

        try:  # from here on the cluster-wide role is always dropped
            admin.execute(f'GRANT CREATE ON DATABASE "{params["dbname"]}" TO {role}')
            yield location.replace("://postgres@", f"://{role}@", 1), revoke
        finally:
            close_left_open()  # a ledger left open releases its lease before the role goes
            admin.execute(f"DROP OWNED BY {role}")  # its schema, with the store
            admin.execute(f'REVOKE CREATE ON DATABASE "{params["dbname"]}" FROM {role}')
            admin.execute(f"DROP ROLE {role}")


def test_an_unwritable_store_is_said_at_start_and_replies_are_counted_untracked(
    store_location: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With leases (PostgreSQL's default) opening renews one and fails loudly already; a
    # single-host PostgreSQL store (leases off) and SQLite opened and read fine.
    monkeypatch.setenv(LEASES_ENV, "off")
    with owned_store(store_location) as (location, make_unwritable):
        asyncio.run(deliver_one(location))
        make_unwritable()
        caplog.set_level(logging.INFO, logger="gateway_ledger")
        report, out, stats, adapter = asyncio.run(start_and_deliver(location, caplog))
        assert_said_and_counted(report, out, stats, adapter, caplog)
        assert not DeliveryLedger.open(location).exists(out.obligation_id)


def test_a_writable_store_starts_available(store_location: str) -> None:
    async def main() -> None:
        async with Gateway.open(store_location) as gw:
            report = await gw.start([ScriptedAdapter()])
            assert (report.ledger_available, report.ledger_problem) == (True, None)
            await gw.deliver(CTX, Reply("hi"), "in-1")
            assert gw.stats().untracked == 0

    asyncio.run(main())


# -- a record write that fails after the deadline --------------------------------------------


class _Lock:
    """Another process's transaction holding the store's write lock."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.conn: Any = None

    def __enter__(self) -> _Lock:
        if not self.location.startswith("postgres"):
            self.conn = sqlite3.connect(self.location, isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            params = parse_postgres_url(self.location)
            self.conn = connect(params)
            self.conn.execute("BEGIN")
            self.conn.execute(
                f'LOCK TABLE "{params["schema"]}".gateway_ledger_events IN ACCESS EXCLUSIVE MODE'
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def test_a_record_that_fails_after_the_deadline_is_a_ledger_fault(
    store_location: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No adapter for the platform: the reply is queued for a later sweep, and only its
    record can keep it. That record waits on a lock past the deadline, then fails."""
    caplog.set_level(logging.INFO, logger="gateway_ledger")
    env = {**store_environment(store_location), "SQLITE_LOCK_TIMEOUT": "1"}
    env["POSTGRES_LOCK_TIMEOUT"] = "1"

    async def main() -> None:
        gw = Gateway(DeliveryLedger(env), ledger_deadline=0.3)
        async with gw:
            await gw.start([ScriptedAdapter()])
            await gw.deliver(CTX, Reply("warm up"), "in-0")
            await gw.flush()
            faults = gw.stats().ledger_faults
            offline = ReplyContext(session_key=KEY, platform="discord", chat_id="7")
            with _Lock(store_location):
                out = await gw.deliver(offline, Reply("owed"), "in-1")
                assert out.status == "queued"
                assert gw.stats().ledger_faults == faults + 1  # the deadline
                until = time.monotonic() + 30  # PostgreSQL: ~12 s to give up
                while gw.stats().ledger_faults < faults + 2 and time.monotonic() < until:
                    await asyncio.sleep(0.05)
            stats = gw.stats()
            assert stats.ledger_faults == faults + 2  # ... and the failed write itself
            assert stats.untracked == 1
            assert not gw.ledger.exists(out.obligation_id)

    asyncio.run(main())
    assert any("record after the deadline" in r.getMessage() for r in caplog.records)


# -- the same id with other content, through the gateway -------------------------------------


def test_another_reply_under_a_recorded_id_is_a_fault_and_goes_out_untracked(
    store_location: str,
) -> None:
    """The gateway's choice: the reply is sent once, untracked (a ledger fault never keeps
    a reply from the user, and this one is not the recorded one); the first record stands.
    The same reply again is still "already recorded" and not sent."""

    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            first = await gw.deliver(CTX, Reply("hello"), "in-1")
            await gw.flush()
            image = MediaItem(kind="image", uri="file:///cat.png")
            other = await gw.deliver(CTX, Reply("hello", media=(image,)), "in-1")
            assert other.obligation_id == first.obligation_id
            assert (other.status, other.ledger_fault) == ("delivered", True)
            same = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert same.status == "already_recorded"
            await gw.flush()
            stats = gw.stats()
            assert (stats.untracked, stats.ledger_faults, stats.already_recorded) == (1, 1, 1)
            assert [(s.content, s.media) for s in adapter.sent] == [
                ("hello", ()),
                ("hello", (image,)),
            ]
            history = [h.type for h in gw.ledger.history(first.obligation_id)]
            assert history == ["Recorded", "Attempting", "Delivered"]
            assert gw.ledger.get(first.obligation_id).media == ()

    asyncio.run(main())
