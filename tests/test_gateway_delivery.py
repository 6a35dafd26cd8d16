"""The one delivery path: skip rules, error classes, retries, multi-part, recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from gateway_ledger.application.delivery.ports import (
    DUPLICATE_NOTICE,
    Reply,
    ReplyContext,
    SendResult,
)
from gateway_ledger.application.delivery.scheduling import ManualScheduler
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.values import ErrorClass, MediaItem
from tests.gateway_fakes import MemorySessions, ScriptedAdapter, dead_owner

KEY = "agent:main:telegram:dm:99"
CTX = ReplyContext(session_key=KEY, platform="telegram", chat_id="99", thread_id="t1")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def types(gw: Gateway, oid: str) -> list[str]:
    return [h.type for h in gw.ledger.history(oid)]


def guards(gw: Gateway, oid: str) -> list[str]:
    """What each send recorded it did against an unannounced duplicate (ADR 0026)."""
    return [h.fields["guard"] for h in gw.ledger.history(oid) if h.type == "Attempting"]


def test_a_reply_costs_two_commits_and_leaves_a_full_history(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert out.status == "delivered" and out.message_ids == ("m1",)
            # Delivered is written behind the send (ADR 0016): durable within the linger.
            await gw.flush()
            assert types(gw, out.obligation_id) == ["Recorded", "Attempting", "Delivered"]
            assert gw.stats().commits == 2
            assert adapter.sent[0].content == "hello"
            assert adapter.sent[0].reply_to == "in-1"
            assert adapter.sent[0].target.thread_id == "t1"

    run(main())


def test_delivered_rides_with_the_next_reply_or_lands_alone_after_the_linger(
    store_location: str,
) -> None:
    async def main() -> None:
        async with Gateway.open(store_location) as gw:
            await gw.start([ScriptedAdapter()])
            first = await gw.deliver(CTX, Reply("one"), "in-1")
            assert types(gw, first.obligation_id) == ["Recorded", "Attempting"]
            second = await gw.deliver(CTX, Reply("two"), "in-2")
            # The second reply's durable point carried the first reply's Delivered.
            assert types(gw, first.obligation_id)[-1] == "Delivered"
            assert gw.stats().commits == 2
            await asyncio.sleep(gw.writer.linger * 5)  # nothing else comes: the linger ends
            assert types(gw, second.obligation_id)[-1] == "Delivered"
            assert gw.stats().commits == 3

    run(main())


def test_waiting_for_delivered_is_still_available(store_location: str) -> None:
    async def main() -> None:
        async with Gateway.open(store_location, write_behind=False) as gw:
            await gw.start([ScriptedAdapter()])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert types(gw, out.obligation_id)[-1] == "Delivered"
            assert gw.stats().commits == 2

    run(main())


@pytest.mark.parametrize(
    ("inbound", "reply", "reason", "sent"),
    [
        ("/status", Reply("all good"), "slash_command", True),
        ("!status", Reply("all good"), "command_prefix", True),
        ("hi", Reply("typing...", ephemeral=True), "ephemeral", True),
        ("hi", Reply("   "), "empty", False),
    ],
)
def test_skip_rules_send_without_an_obligation(
    store_location: str, inbound: str, reply: Reply, reason: str, sent: bool
) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            ctx = ReplyContext(KEY, "telegram", "99", inbound_text=inbound)
            out = await gw.deliver(ctx, reply, "in-1")
            assert (out.status, out.skip_reason) == ("skipped", reason)
            assert bool(adapter.sent) is sent
            oid = compute_obligation_id(KEY, "in-1", reply.content)
            assert not gw.ledger.exists(oid)
            assert gw.stats().commits == 0

    run(main())


def test_rejected_retries_plain_after_30_then_120_seconds_then_leaves_it_to_the_sweep(
    store_location: str,
) -> None:
    async def main() -> None:
        no = SendResult.failed(ErrorClass.REJECTED, "400")
        adapter = ScriptedAdapter(script=[no, no, no])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert (out.status, out.error_class, out.retry_in) == ("failed", "rejected", 30.0)
            assert await clock.advance(29) == 0
            assert await clock.advance(1) == 1
            assert await clock.advance(120) == 1
            assert clock.pending == 0  # the last recovery attempt is the boot sweep's
            assert [d for _, d in clock.delays] == [30.0, 120.0]
            assert [s.content for s in adapter.sent] == ["hello"] * 3  # never a marker
            await gw.flush()
            status = gw.ledger.get(out.obligation_id)
            assert (status.state, status.send_attempts, status.needs_marker) == ("failed", 3, False)

    run(main())


def test_ambiguous_failure_marks_the_next_send(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter(script=[TimeoutError("read timeout")])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert (out.status, out.error_class) == ("failed", "ambiguous")
            await clock.advance(30)
            assert adapter.sent[1].content.startswith(DUPLICATE_NOTICE)
            assert adapter.sent[1].content.endswith("hello")
            await gw.flush()
            assert gw.ledger.get(out.obligation_id).state == "delivered"
            assert guards(gw, out.obligation_id) == ["none", "marker"]
            assert gw.ledger.audit_duplicates().ok

    run(main())


def test_rate_limit_waits_are_capped_and_spend_no_attempt(store_location: str) -> None:
    async def main() -> None:
        slow = SendResult.failed(ErrorClass.RATE_LIMITED, "429", retry_after=5000)
        fast = SendResult.failed(ErrorClass.RATE_LIMITED, "429", retry_after=2)
        no = SendResult.failed(ErrorClass.REJECTED, "400")
        adapter = ScriptedAdapter(script=[slow, fast, no])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            await gw.deliver(CTX, Reply("hello"), "in-1")
            await clock.advance(900)
            await clock.advance(2)
            await clock.advance(30)  # the first backoff slot is still unspent
            assert [d for _, d in clock.delays] == [900.0, 2.0, 30.0]
            assert len(adapter.sent) == 4
            await gw.flush()
            assert gw.ledger.get(adapter_oid()).state == "delivered"
            assert all(not s.content.startswith(DUPLICATE_NOTICE) for s in adapter.sent)
            assert gw.stats().rate_limit_waits == 2

    run(main())


def adapter_oid() -> str:
    return compute_obligation_id(KEY, "in-1", "hello")


def test_dead_target_is_abandoned_at_once_and_never_retried(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter(script=[SendResult.failed(ErrorClass.DEAD_TARGET, "403")])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert out.status == "abandoned"
            assert clock.pending == 0
            await gw.flush()
            status = gw.ledger.get(out.obligation_id)
            assert (status.state, status.abandon_reason) == ("abandoned", "dead_target")
            assert types(gw, out.obligation_id)[-2:] == ["Failed", "Abandoned"]

    run(main())


def test_native_idempotency_gets_the_obligation_id_and_no_marker(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter(script=[TimeoutError()], idempotent=True)
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            await clock.advance(30)
            assert [s.idempotency_key for s in adapter.sent] == [out.obligation_id] * 2
            assert [s.content for s in adapter.sent] == ["hello", "hello"]
            await gw.flush()
            assert guards(gw, out.obligation_id) == ["idempotency_key"] * 2

    run(main())


def test_same_turn_twice_is_sent_once(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            first = await gw.deliver(CTX, Reply("hello"), "in-1")
            again = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert (first.status, again.status) == ("delivered", "already_recorded")
            assert len(adapter.sent) == 1

    run(main())


def test_recovery_keeps_anchor_thread_media_and_marks_only_possible_duplicates(
    store_location: str,
) -> None:
    """A dead gateway left one reply pending and one mid-send; the next start sends both."""

    async def main() -> None:
        media = [MediaItem(kind="image", uri="file:///tmp/a.png", caption="chart")]
        dead = Gateway.open(store_location, owner=dead_owner())
        hung = ScriptedAdapter(script=["hang"])
        await dead.start([hung])
        task = asyncio.create_task(dead.deliver(CTX, Reply("mid-send"), "in-2"))
        while not hung.sent:
            await asyncio.sleep(0.01)
        task.cancel()  # the process "dies" with the send in flight
        pending = compute_obligation_id(KEY, "in-1", "")
        dead.ledger.record_obligation(
            obligation_id=pending,
            session_key=KEY,
            platform="telegram",
            chat_id="99",
            thread_id="t1",
            content="",
            reply_to="in-1",
            media=media,
        )
        await dead.close()

        sessions = MemorySessions([KEY, "agent:main:telegram:dm:other"])
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location, sessions=sessions) as gw:
            report = await gw.start([adapter])
            assert (report.claimed, report.redelivered) == (2, 2)
            by_anchor = {s.reply_to: s for s in adapter.sent}
            assert by_anchor["in-2"].content == f"{DUPLICATE_NOTICE}\nmid-send"
            assert by_anchor["in-1"].content == "chart"  # pending: plain
            assert by_anchor["in-1"].media[0].uri == "file:///tmp/a.png"
            assert all(s.target.thread_id == "t1" for s in adapter.sent)
            assert sessions.calls == [f"clear {KEY}", "pending"]
            assert report.resumable_sessions == ("agent:main:telegram:dm:other",)

    run(main())


def test_multi_part_recovery_resends_only_unconfirmed_parts(store_location: str) -> None:
    async def main() -> None:
        media = [MediaItem(kind="image", uri="file:///tmp/a.png")]
        reply = Reply("aaabbbccc", parts=("aaa", "bbb", "ccc"), media=media)
        dead = Gateway.open(store_location, owner=dead_owner())
        hung = ScriptedAdapter(script=[SendResult.ok("p0"), "hang"])
        await dead.start([hung])
        task = asyncio.create_task(dead.deliver(CTX, reply, "in-1"))
        while len(hung.sent) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        await dead.close()

        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            sent = [(s.content, [m.uri for m in s.media]) for s in adapter.sent]
            assert sent == [
                (f"{DUPLICATE_NOTICE}\nbbb", []),  # may have arrived: marked
                ("ccc", []),  # never started: plain
                ("", ["file:///tmp/a.png"]),
            ]
            oid = compute_obligation_id(KEY, "in-1", "aaabbbccc")
            await gw.flush()
            status = gw.ledger.get(oid)
            assert status.state == "delivered"
            assert status.receipt[0] == "p0"
            assert types(gw, oid).count("PartDelivered") == 3  # p0 before, then 1 and 2

    run(main())


def test_recovered_reply_clears_the_real_session_resume_flag(
    store_location: str, tmp_path: Any
) -> None:
    """With issue 4's SessionStore: the redelivered turn is not re-run after the restart."""
    from gateway_ledger.application.delivery.recovery_port import SessionStoreResume
    from gateway_ledger.bootstrap import SessionStore
    from gateway_ledger.domain.sessions.source import SessionSource

    async def main() -> None:
        store = SessionStore.open(tmp_path / "sessions.db")  # its own store, as deployed
        source = SessionSource(platform="telegram", chat_id="99", chat_type="dm", user_id="u1")
        session = store.resolve(source)
        store.mark_resume_pending(session.session_id)
        ctx = ReplyContext.from_session(session)
        dead = Gateway.open(store_location, owner=dead_owner())
        hung = ScriptedAdapter(script=["hang"])
        await dead.start([hung])
        task = asyncio.create_task(dead.deliver(ctx, Reply("the answer"), "in-1"))
        while not hung.sent:
            await asyncio.sleep(0.01)
        task.cancel()
        await dead.close()

        resume = SessionStoreResume(store)
        async with Gateway.open(store_location, sessions=resume) as gw:
            report = await gw.start([ScriptedAdapter()])
            assert report.redelivered == 1
        assert store.resolve(source).should_auto_continue is False

    run(main())
