"""A write under a data key that another process destroyed is refused, never silent (ADR 0028).

Each test opens a ledger here (its key cache then holds the session's key), runs
``gateway-ledger sessions forget`` in a child process (which cannot evict this process's
cache), and writes again for the same session through one of the write paths: the
synchronous API, the group-commit writer, and the gateway. The write must raise
``SessionErased`` and append nothing; the gateway neither records nor sends the reply.

A subject's first write has no stored key to check: it creates one. The erasure's
tombstone stands in for it (ADR 0071): a first write that an erasure overtook between
sealing and commit is refused the same way, on both stores.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.bootstrap import DeliveryLedger, Gateway, SessionStore
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import LedgerError, SessionErased
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from gateway_ledger.infrastructure.privacy.key_table import is_tombstone
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED
from tests.gateway_fakes import ScriptedAdapter
from tests.test_key_staging import racing

KEY = "agent:main:telegram:dm:70707"
CHAT = "70707"
CLI = str(Path(sys.executable).parent / "gateway-ledger")


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("GATEWAY_LEDGER_SECRET_DIR", str(tmp_path / "secret"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


def forget_elsewhere(location: str, key: str = KEY, *, found: bool = True) -> None:
    """``sessions forget`` in a child process: this process's key cache is not told.
    ``found=False``: the subject has nothing stored yet (exit 2, the erasure recorded)."""
    done = subprocess.run(
        [CLI, "sessions", "forget", key, "--db", location],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == (0 if found else 2), done.stderr


def subject_rows(ledger: DeliveryLedger) -> list[str]:
    """The key ids in the subject's row of the key table, tombstones included."""
    ring = ledger.private_mapper.keyring
    subject = ring.subject_id(KEY)
    return [key_id for _, (key_id, _) in ring.table.get_many([subject]).items()]


def erasing_after_sealing(ledger: Any, location: str) -> list[object]:
    """From now on, the ledger's first event sealed is followed, before its write commits,
    by an erasure of its subject in another process; returns the events it sealed."""
    mapped = ledger.mapper.to_stored_event
    race = lambda: forget_elsewhere(location, found=False)  # noqa: E731
    ledger.mapper.to_stored_event, calls = racing(mapped, race)
    return calls


def record(ledger: DeliveryLedger, oid: str, content: str) -> None:
    ledger.record_obligation(
        obligation_id=oid, session_key=KEY, platform="telegram", chat_id=CHAT, content=content
    )


def test_the_synchronous_api_refuses_a_write_under_a_key_destroyed_elsewhere(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    record(ledger, "o-before", "said before the erasure")
    ledger.mark_attempting("o-before")
    forget_elsewhere(store_location)

    with pytest.raises(SessionErased):
        record(ledger, "o-during", "generated while the user was being forgotten")
    assert not ledger.exists("o-during")  # nothing appended

    # The refusal forgets the destroyed key here: a later write starts a new key period.
    record(ledger, "o-after", "a new conversation")
    fresh = DeliveryLedger.open(store_location)
    assert fresh.get("o-after").content == "a new conversation"
    assert fresh.get("o-before").content == ERASED
    assert not fresh.is_erased("o-after")
    fresh.close()
    ledger.close()


def test_the_group_commit_writer_refuses_a_write_under_a_key_destroyed_elsewhere(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    writer = GroupCommitWriter(ledger)
    first = ledger.new_obligation(
        obligation_id="o-before", session_key=KEY, platform="telegram", chat_id=CHAT, content="a"
    )
    writer.submit(first.collect_events()).result(timeout=10)
    forget_elsewhere(store_location)

    late = ledger.new_obligation(
        obligation_id="o-during", session_key=KEY, platform="telegram", chat_id=CHAT, content="b"
    )
    refused_beside_an_innocent_reply(ledger, writer, late)
    ledger.close()


def refused_beside_an_innocent_reply(
    ledger: DeliveryLedger, writer: GroupCommitWriter, late: DeliveryObligation
) -> None:
    """``late`` and another session's reply go in one group: ``late`` is refused as
    erased and appends nothing; the other commits."""
    other = ledger.new_obligation(
        obligation_id="o-other", session_key="agent:main:telegram:dm:1", platform="telegram",
        chat_id="1", content="someone else",
    )  # fmt: skip
    with writer._cond:  # one group: an innocent job and the refused one
        innocent = writer.submit(other.collect_events())
        refused = writer.submit(late.collect_events())
    assert isinstance(refused.exception(timeout=10), SessionErased)
    assert innocent.exception(timeout=10) is None
    writer.close()
    assert not ledger.exists(late.obligation_id)
    assert ledger.get("o-other").content == "someone else"


def test_the_gateway_neither_records_nor_sends_a_reply_to_a_session_erased_elsewhere(
    store_location: str,
) -> None:
    ctx = ReplyContext(session_key=KEY, platform="telegram", chat_id=CHAT)

    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            first = await gw.deliver(ctx, Reply("before"), "in-1")
            assert first.status == "delivered"
            await gw.flush()
            await asyncio.get_running_loop().run_in_executor(None, forget_elsewhere, store_location)
            out = await gw.deliver(ctx, Reply("an answer to a forgotten conversation"), "in-2")
            assert out.status == "erased"
            assert [s.content for s in adapter.sent] == ["before"]  # not sent
            assert not gw.ledger.exists(str(out.obligation_id))  # not recorded
            stats = gw.stats()
            assert (stats.erased, stats.ledger_faults) == (1, 0)

    asyncio.run(main())


@pytest.mark.parametrize("first", ["append", "resolve"])
def test_the_session_store_refuses_an_append_to_an_erased_session_and_starts_afresh(
    store_location: str, first: str
) -> None:
    """An append to the erased conversation is refused; the user's next message starts a
    new session under a new key (new data, ADR 0012), without an error, whichever of the
    two this process writes first after the erasure."""
    DeliveryLedger.open(store_location).close()  # the ledger half lives in the same store
    store = SessionStore.open(store_location)
    source = SessionSource(platform="telegram", chat_id=CHAT, user_id="u-70707")
    ctx = store.resolve(source)
    store.append(ctx, "user", "please forget me", "in-1")
    forget_elsewhere(store_location, ctx.key)

    if first == "append":
        with pytest.raises(SessionErased):
            store.append(ctx, "assistant", "an answer to the forgotten conversation")
    again = store.resolve(source)
    assert again.session_id != ctx.session_id and again.is_new
    store.append(again, "user", "a new conversation", "in-2")
    with pytest.raises(LedgerError):  # erased (or, once rotated, ended): never appended
        store.append(ctx, "assistant", "an answer to the forgotten conversation")
    fresh = SessionStore.open(store_location)
    assert [m.content for m in fresh.history(again.session_id)] == ["a new conversation"]
    assert [m.content for m in fresh.history(ctx.session_id)] == [ERASED]
    fresh.close()
    store.close()


@pytest.mark.parametrize("before", ["nothing", "an earlier erasure"])
@pytest.mark.parametrize("path", ["synchronous API", "group-commit writer"])
def test_a_first_write_an_erasure_overtook_is_refused_and_stores_no_key(
    store_location: str, path: str, before: str
) -> None:
    """The subject's first write seals under a new key (nothing stored yet, or only an
    earlier erasure's tombstone); an erasure in another process completes before that
    write commits. The write is refused and leaves no key; a write that begins after the
    erasure is a new key period (ADR 0071) and is stored."""
    ledger = DeliveryLedger.open(store_location)
    if before == "an earlier erasure":
        forget_elsewhere(store_location, found=False)
    tombstones = subject_rows(ledger)
    sealed = erasing_after_sealing(ledger, store_location)
    if path == "synchronous API":
        with pytest.raises(SessionErased):
            record(ledger, "o-during", "made before the erasure, committed after it")
    else:
        writer = GroupCommitWriter(ledger)
        late = ledger.new_obligation(
            obligation_id="o-during", session_key=KEY, platform="telegram", chat_id=CHAT,
            content="made before the erasure, committed after it",
        )  # fmt: skip
        assert isinstance(writer.submit(late.collect_events()).exception(10), SessionErased)
        writer.close()
    assert len(sealed) == 2  # sealed, overtaken (KeyRaceLost), found the new tombstone
    assert not ledger.exists("o-during")
    (tombstone,) = subject_rows(ledger)
    assert is_tombstone(tombstone) and [tombstone] != tombstones  # the racing erasure's

    record(ledger, "o-after", "a message after the erasure")  # no erasure races it now
    fresh = DeliveryLedger.open(store_location)
    assert fresh.get("o-after").content == "a message after the erasure"
    (key_id,) = subject_rows(fresh)
    assert not is_tombstone(key_id)  # the new key took the tombstone's place
    fresh.close()
    ledger.close()


@pytest.mark.parametrize("path", ["synchronous API", "group-commit writer"])
def test_a_first_reply_made_before_an_erasure_and_sealed_after_it_is_refused(
    store_location: str, path: str
) -> None:
    """A reply made before its session's erasure began, and first sealed only after the
    erasure finished (a writer's queue, a paused process): it belongs to the forgotten
    conversation and is refused, although the write found only the tombstone. A reply
    made after the erasure is new data."""
    ledger = DeliveryLedger.open(store_location)
    made_before = ledger.new_obligation(
        obligation_id="o-made-before", session_key=KEY, platform="telegram", chat_id=CHAT,
        content="made before the erasure, sealed after it",
    )  # fmt: skip
    forget_elsewhere(store_location, found=False)
    if path == "synchronous API":
        with pytest.raises(SessionErased):
            ledger.save(made_before)
    else:
        refused_beside_an_innocent_reply(ledger, GroupCommitWriter(ledger), made_before)
    assert not ledger.exists("o-made-before")
    (tombstone,) = subject_rows(ledger)
    assert is_tombstone(tombstone)

    record(ledger, "o-made-after", "made after the erasure")
    assert ledger.get("o-made-after").content == "made after the erasure"
    ledger.close()


def test_the_gateway_neither_records_nor_sends_a_first_reply_an_erasure_overtook(
    store_location: str,
) -> None:
    """The race `simulate --faults` found (docs/privacy.md): the gateway's writer sealed a
    conversation's first reply under a new key, and the conversation was forgotten
    elsewhere before the reply committed. It is neither recorded nor sent."""
    ctx = ReplyContext(session_key=KEY, platform="telegram", chat_id=CHAT)

    async def main() -> None:
        adapter = ScriptedAdapter()
        # The erasure runs in a child process inside the write: give it time, so that the
        # refusal reaches the reply before the gateway would send it untracked.
        async with Gateway.open(store_location, ledger_deadline=60) as gw:
            await gw.start([adapter])
            sealed = erasing_after_sealing(gw.ledger, store_location)
            out = await gw.deliver(ctx, Reply("an answer the user asked to forget"), "in-1")
            assert out.status == "erased" and len(sealed) > 1  # sealed again, then refused
            assert adapter.sent == []
            assert not gw.ledger.exists(str(out.obligation_id))
            stats = gw.stats()
            assert (stats.erased, stats.ledger_faults) == (1, 0)

    asyncio.run(main())


def test_a_postgres_erasure_waits_for_a_first_key_in_flight_and_destroys_it(pg_url: str) -> None:
    """A writer inserted the subject's first key and has not committed when the erasure
    reads the table: the erasure's tombstone waits for that commit, then the erasure
    deletes the key it had not seen, and leaves its tombstone in its place."""
    ledger = DeliveryLedger.open(pg_url)
    ring = ledger.private_mapper.keyring
    subject = ring.subject_id(KEY)
    datastore = ledger.recorder.datastore
    keys = f'"{datastore.schema}".gateway_ledger_subject_keys'
    destroyed: list[list[str]] = []
    params = parse_postgres_url(pg_url)
    with connect(params) as writer, connect(params) as observer:
        with writer.transaction():
            writer.execute(
                f"INSERT INTO {keys} VALUES (%s, %s, %s, %s)",
                ("k-first", subject, b"wrapped", "2026-12-05T00:00:00+00:00"),
            )
            erasure = threading.Thread(target=lambda: destroyed.append(ring.destroy(subject)))
            erasure.start()
            deadline = time.monotonic() + 10
            while not waiting_on_a_lock(observer, keys) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert waiting_on_a_lock(observer, keys), "the erasure did not wait for the writer"
        erasure.join(timeout=30)
    assert destroyed == [["k-first"]]
    (row,) = subject_rows(ledger)
    assert is_tombstone(row)
    ledger.close()


def waiting_on_a_lock(conn: psycopg.Connection, keys: str) -> bool:
    """Another session's statement on the key table is waiting for a lock (asked outside
    any transaction: within one, the server's activity view is read once)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query ILIKE %s AND pid <> pg_backend_pid()",
        ("%" + keys.split(".")[-1] + "%",),
    ).fetchone()
    return bool(row and row[0])
