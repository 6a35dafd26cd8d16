"""A write under a data key that another process destroyed is refused, never silent (ADR 0028).

Each test opens a ledger here (its key cache then holds the session's key), runs
``gateway-ledger sessions forget`` in a child process (which cannot evict this process's
cache), and writes again for the same session through one of the write paths: the
synchronous API, the group-commit writer, and the gateway. The write must raise
``SessionErased`` and append nothing; the gateway neither records nor sends the reply.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.bootstrap import DeliveryLedger, Gateway, SessionStore
from gateway_ledger.domain.errors import LedgerError, SessionErased
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED
from tests.gateway_fakes import ScriptedAdapter

KEY = "agent:main:telegram:dm:70707"
CHAT = "70707"
CLI = str(Path(sys.executable).parent / "gateway-ledger")


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("GATEWAY_LEDGER_SECRET_DIR", str(tmp_path / "secret"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


def forget_elsewhere(location: str, key: str = KEY) -> None:
    """``sessions forget`` in a child process: this process's key cache is not told."""
    done = subprocess.run(
        [CLI, "sessions", "forget", key, "--db", location],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr


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

    other = ledger.new_obligation(
        obligation_id="o-other", session_key="agent:main:telegram:dm:1", platform="telegram",
        chat_id="1", content="someone else",
    )  # fmt: skip
    late = ledger.new_obligation(
        obligation_id="o-during", session_key=KEY, platform="telegram", chat_id=CHAT, content="b"
    )
    with writer._cond:  # one group: an innocent job and the refused one
        innocent = writer.submit(other.collect_events())
        refused = writer.submit(late.collect_events())
    assert isinstance(refused.exception(timeout=10), SessionErased)
    assert innocent.exception(timeout=10) is None
    writer.close()
    assert not ledger.exists("o-during")
    assert ledger.get("o-other").content == "someone else"
    ledger.close()


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
