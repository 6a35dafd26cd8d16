"""Per-chat order and one rate budget for every send (issue 18, ADRs 0065 and 0060).

Real stores, real time (waits are short), real child processes for the crash and claim.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from gateway_ledger.application.delivery.ports import (
    DUPLICATE_NOTICE,
    AdapterBase,
    Reply,
    ReplyContext,
    SendResult,
)
from gateway_ledger.application.delivery.rate_limits import Limit, RateLimits
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.values import (
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    OwnerIdentity,
)
from gateway_ledger.infrastructure.pacing.shared_budget import SharedBudget

CHILD = str(Path(__file__).parent / "order_child.py")
LEASES = {
    "GATEWAY_LEDGER_LEASE_TTL": "1.5",
    "GATEWAY_LEDGER_LEASE_RENEW": "0.3",
    "GATEWAY_LEDGER_CLOCK_SKEW": "0.2",
}


def context(chat: str) -> ReplyContext:
    return ReplyContext(
        session_key=f"agent:main:telegram:dm:{chat}", platform="telegram", chat_id=chat
    )


def policy(order_wait: float = 120.0, backoff: float = 0.3) -> LedgerPolicy:
    return LedgerPolicy(
        retry_backoff=(timedelta(seconds=backoff), timedelta(seconds=backoff)),
        order_wait=timedelta(seconds=order_wait),
    )


class Platform(AdapterBase):
    """Records each hand-off (chat, text, monotonic time); answers by ``answer``."""

    def __init__(self, limits: RateLimits | None = None, answer: Any = None) -> None:
        self.platform = "telegram"
        self.rate_limits = limits
        self.handoffs: list[tuple[str, str, float]] = []
        self.answer = answer or (lambda chat, text, n: SendResult.ok(f"m{n}"))

    async def send(
        self,
        target: DeliveryTarget,
        content: str,
        *,
        reply_to: str | None,
        media: Sequence[MediaItem],
        metadata: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> SendResult:
        self.handoffs.append((target.chat_id, content, time.monotonic()))
        answer = self.answer(target.chat_id, content, len(self.handoffs))
        if asyncio.iscoroutine(answer):
            answer = await answer
        return answer


def types(gw: Gateway, oid: str) -> list[str]:
    return [h.type for h in gw.ledger.history(oid)]


def fields(gw: Gateway, oid: str, kind: str) -> list[dict[str, Any]]:
    return [dict(h.fields) for h in gw.ledger.history(oid) if h.type == kind]


def test_a_reply_waits_for_the_retry_of_an_earlier_one_to_its_chat(store_location: str) -> None:
    """A retry never overtakes a newer reply, nor a newer reply the retry: the second
    reply waits for the first one's retry, while another chat is not held at all."""

    def answer(chat: str, text: str, n: int) -> SendResult:
        if n == 1:
            return SendResult.failed(ErrorClass.REJECTED, "503")
        return SendResult.ok(f"m{n}")

    async def main() -> None:
        platform = Platform(answer=answer)
        async with Gateway.open(store_location, policy=policy(backoff=0.3)) as gw:
            await gw.start([platform])
            first = await gw.deliver(context("7"), Reply("first"), "in-1")
            assert first.status == "failed" and first.retry_in == 0.3
            second, other = await asyncio.gather(
                gw.deliver(context("7"), Reply("second"), "in-2"),
                gw.deliver(context("8"), Reply("elsewhere"), "in-3"),
            )
            assert second.status == other.status == "delivered"
            texts = [text for _, text, _ in platform.handoffs]
            assert texts == ["first", "elsewhere", "first", "second"]
            await gw.flush()
            waited = fields(gw, second.obligation_id, "Waited")
            assert [w["reason"] for w in waited] == ["order"] and waited[0]["seconds"] > 0.2
            assert "OrderReleased" not in types(gw, second.obligation_id)
            assert "Waited" not in types(gw, other.obligation_id)  # not held: one commit
            assert types(gw, other.obligation_id)[:2] == ["Recorded", "Attempting"]
            assert gw.stats().pacing is not None and gw.stats().pacing.order_released == 0

    asyncio.run(main())


def test_one_stuck_reply_holds_its_chat_no_longer_than_the_bound(store_location: str) -> None:
    """A platform that never answers for one message: the next reply to that chat goes
    once the bound has passed, and says whom it went before."""
    stuck = asyncio.Event()

    async def never(chat: str, text: str, n: int) -> SendResult:
        if text == "stuck":
            await stuck.wait()
        return SendResult.ok(f"m{n}")

    async def main() -> None:
        platform = Platform(answer=never)
        async with Gateway.open(store_location, policy=policy(order_wait=0.5)) as gw:
            await gw.start([platform])
            hung = asyncio.create_task(gw.deliver(context("7"), Reply("stuck"), "in-1"))
            while not platform.handoffs:
                await asyncio.sleep(0.01)
            started = time.monotonic()
            later = await gw.deliver(context("7"), Reply("later"), "in-2")
            held = time.monotonic() - started
            assert later.status == "delivered" and 0.45 <= held < 5
            await gw.flush()
            released = fields(gw, later.obligation_id, "OrderReleased")
            assert len(released) == 1
            assert released[0]["reason"] == "timeout"
            assert released[0]["behind"] == hung_oid(gw)
            # recorded before the send it allowed
            kinds = types(gw, later.obligation_id)
            assert kinds.index("OrderReleased") < kinds.index("Attempting")
            # a reply after it no longer waits for the stuck one, and says so too
            third = await gw.deliver(context("7"), Reply("third"), "in-3")
            assert third.status == "delivered"
            await gw.flush()
            assert [f["behind"] for f in fields(gw, third.obligation_id, "OrderReleased")] == [
                hung_oid(gw)
            ]
            assert gw.stats().pacing.order_released == 2
            stuck.set()
            assert (await hung).status == "delivered"

    asyncio.run(main())


def hung_oid(gw: Gateway) -> str:
    from gateway_ledger.domain.delivery.obligation import compute_obligation_id

    return compute_obligation_id("agent:main:telegram:dm:7", "in-1", "stuck")


def test_a_retry_after_pauses_the_whole_bot_for_every_sender(store_location: str) -> None:
    """A 429 for the bot holds every chat of that platform, not just the reply told;
    one for a chat holds only that chat."""

    told: set[str] = set()

    def answer(chat: str, text: str, n: int) -> SendResult:
        scope = {"bot-429": "bot", "chat-429": "chat"}.get(text)
        if scope is not None and text not in told:  # once: the retry goes through
            told.add(text)
            return SendResult.failed(ErrorClass.RATE_LIMITED, "429", 0.6, retry_scope=scope)
        return SendResult.ok(f"m{n}")

    async def main() -> None:
        platform = Platform(answer=answer)
        async with Gateway.open(store_location) as gw:
            await gw.start([platform])
            told = await gw.deliver(context("1"), Reply("bot-429"), "in-1")
            assert told.status == "failed" and told.error_class == "rate_limited"
            paused_at = platform.handoffs[-1][2]
            assert [p.scope for p in gw.stats().pacing.pauses] == ["bot"]
            other = await gw.deliver(context("2"), Reply("other chat"), "in-2")
            assert other.status == "delivered"
            assert platform.handoffs[-1][2] - paused_at >= 0.55
            await gw.flush()
            assert fields(gw, other.obligation_id, "Waited")[0]["reason"] == "pause"
            # a chat's 429 holds that chat only
            await gw.deliver(context("3"), Reply("chat-429"), "in-3")
            chat_paused_at = platform.handoffs[-1][2]
            free = await gw.deliver(context("4"), Reply("free chat"), "in-4")
            assert platform.handoffs[-1][2] - chat_paused_at < 0.3
            await gw.flush()
            assert "Waited" not in types(gw, free.obligation_id)

    asyncio.run(main())


def test_a_bot_pause_and_the_bot_budget_are_shared_through_the_store(
    store_location: str,
) -> None:
    """Two gateways on one store: each keeps half the bot's limit, and a bot-wide 429
    told to one holds the other's sends too (ADR 0060)."""
    limits = RateLimits(per_bot=Limit(4, 1.0))

    def answer(chat: str, text: str, n: int) -> SendResult:
        if text == "bot-429":
            return SendResult.failed(ErrorClass.RATE_LIMITED, "429", 1.0, retry_scope="bot")
        return SendResult.ok(f"m{n}")

    async def main() -> None:
        me = Gateway.open(store_location, share_period=0.1).owner
        other_owner = OwnerIdentity(
            host=me.host, boot_id=me.boot_id, pid=me.pid, start_time=me.start_time,
            installation_id="the-other-gateway",
        )  # fmt: skip
        one = Gateway.open(store_location, share_period=0.1)
        two = Gateway.open(store_location, owner=other_owner, share_period=0.1)
        a, b = Platform(limits, answer), Platform(limits, answer)
        async with one, two:
            await one.start([a])
            await two.start([b])
            await asyncio.sleep(0.3)  # both renewed: each sees two gateways on the bot
            assert one._courier.pacer.bot_limit("telegram") == Limit(2, 1.0)
            started = time.monotonic()
            await asyncio.gather(
                *(one.deliver(context(f"a{n}"), Reply(f"a{n}"), f"in-{n}") for n in range(4))
            )
            assert time.monotonic() - started >= 0.95  # two a second, for this one
            await one.deliver(context("x"), Reply("bot-429"), "in-x")
            told = a.handoffs[-1][2]  # the 429's own send, not deliver's return after it
            await asyncio.sleep(0.3)  # the other reads it at its next renewal
            await two.deliver(context("b1"), Reply("b1"), "in-b1")
            assert b.handoffs[-1][2] - told >= 0.9

    asyncio.run(main())


def owed_by_a_killed_gateway(store: str, env: Mapping[str, str]) -> None:
    """A gateway process records two replies to chat 7 and is SIGKILLed before sending."""
    owing = subprocess.Popen(
        [sys.executable, CHILD, "owe", store], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owing.stdout is not None and owing.stdout.readline().strip() == "recorded"
    owing.send_signal(signal.SIGKILL)  # the crash: two replies owed, none sent
    owing.wait()


def test_order_across_a_crash_and_a_claim(tmp_path: Path) -> None:
    """A gateway dies owing two replies to a chat; another claims them and re-sends them
    slowly; a third, started after the claim, gets a new reply for that chat: it waits
    for the claimed ones, asked of the store, and goes after them."""
    store = str(tmp_path / "ledger.db")
    journal = str(tmp_path / "journal.jsonl")
    env = {**os.environ, **LEASES}
    owed_by_a_killed_gateway(store, env)
    recovering = subprocess.Popen(
        [sys.executable, CHILD, "recover", store, journal],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert recovering.stdout is not None and recovering.stdout.readline().strip() == "started"

    async def main() -> str:
        platform = Platform()
        async with Gateway.open(store) as gw:
            report = await gw.start([platform])
            assert report.claimed == 0  # the recovering gateway is alive: its claims stand
            out = await gw.deliver(context("7"), Reply("new"), "in-3")
            assert out.status == "delivered"
            await gw.flush()
            assert fields(gw, out.obligation_id, "Waited")[0]["reason"] == "order"
            assert "OrderReleased" not in types(gw, out.obligation_id)
            return str(platform.handoffs[0][2] - time.monotonic() + time.time())

    new_at = float(asyncio.run(main()))
    assert recovering.wait(timeout=60) == 0
    recovered = [json.loads(line) for line in Path(journal).read_text().splitlines()]
    assert [r["text"] for r in recovered] == ["owed 1", "owed 2"]
    assert all(r["at"] < new_at for r in recovered)


def test_a_claimed_reply_waits_a_chat_window_from_the_claim_however_long_the_sweep_took(
    tmp_path: Path,
) -> None:
    """The dead owner may have handed a reply's first part to the platform just before it
    died, so the claimer's re-send to that chat waits one window from the claim, not from
    when the claimer started: here another connection holds the store's write lock while
    the gateway starts, and the boot sweep claims long after the start (a loaded
    ``simulate`` run re-sent a claimed reply 94 ms after its dead owner's hand-off, inside
    a 100 ms window)."""
    import sqlite3
    import threading

    store = str(tmp_path / "ledger.db")
    owing = subprocess.Popen(
        [sys.executable, CHILD, "owe", store], stdout=subprocess.PIPE, text=True
    )
    assert owing.stdout is not None and owing.stdout.readline().strip() == "recorded"
    owing.send_signal(signal.SIGKILL)  # two replies to chat 7 owed, none sent
    owing.wait()
    window = Limit(1, 0.3)
    platform = Platform(RateLimits(per_chat=window))
    released: list[float] = []

    async def main() -> None:
        async with Gateway.open(store) as gw:
            holder = sqlite3.connect(store, isolation_level=None, check_same_thread=False)
            holder.execute("BEGIN IMMEDIATE")  # the write lock: the sweep's claim waits

            def release() -> None:
                time.sleep(0.8)
                released.append(time.monotonic())
                holder.execute("COMMIT")
                holder.close()

            unlock = threading.Thread(target=release)
            unlock.start()
            report = await gw.start([platform])
            unlock.join()
            assert report.claimed == 2 and report.redelivered == 2
            await gw.flush()

    asyncio.run(main())
    first, second = (at for _, _, at in platform.handoffs)
    assert first - released[0] >= window.per  # the claims were made after the release
    assert second - first >= window.per


def test_gateways_killed_while_claimed_replies_waited_spend_none_of_their_recovery_budget(
    tmp_path: Path,
) -> None:
    """ADR 0070: a gateway dies owing two replies to a chat; four gateways in turn claim
    them at boot and are SIGKILLed while the replies wait for the chat's window, before
    any send starts. More claims than ``max_attempts``, yet the next gateway sends both,
    plainly counted: one recovery attempt each, its send's start recorded before it."""
    store = str(tmp_path / "ledger.db")
    journal = str(tmp_path / "journal.jsonl")
    env = {**os.environ, **LEASES}
    owed_by_a_killed_gateway(store, env)
    for _ in range(LedgerPolicy().max_attempts + 1):
        holding = subprocess.Popen(
            [sys.executable, CHILD, "hold", store, journal],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert holding.stdout is not None
            assert holding.stdout.readline().strip() == "claimed 2"
        finally:
            holding.send_signal(signal.SIGKILL)  # before any send started
            holding.wait()
    assert not Path(journal).exists()  # nothing was ever handed to the platform

    async def main() -> None:
        platform = Platform()
        async with Gateway.open(store) as gw:
            report = await gw.start([platform])
            assert (report.claimed, report.redelivered) == (2, 2)
            await gw.flush()
            assert sorted(text for _, text, _ in platform.handoffs) == [
                f"{DUPLICATE_NOTICE}\nowed 1",  # a claim counts as a possible send
                f"{DUPLICATE_NOTICE}\nowed 2",
            ]
            for status in gw.ledger.list(state="delivered"):
                history = types(gw, status.obligation_id)
                assert history.count("Claimed") == LedgerPolicy().max_attempts + 2
                assert history[-2:] == ["RecoverySendStarted", "Delivered"]
                claims = fields(gw, status.obligation_id, "Claimed")
                assert {c["recovery_attempt"] for c in claims} == {1}
                assert all(c["records_send"] for c in claims)

    asyncio.run(main())


def test_the_bound_gives_up_only_the_stuck_reply_not_a_live_gateways_behind_it() -> None:
    """A chat's replies spread over a killed gateway (stuck), another live gateway and
    this one, in that order: at the bound this reply gives up the stuck one only, then
    waits for the other gateway's reply until the store says it is resolved, and finds
    the chat's window full from then (a simulated backlog run found both live gateways
    released together onto one chat: ADR 0065)."""
    from datetime import UTC, datetime

    from gateway_ledger.application.delivery.pacing import FOREIGN, Pacer
    from gateway_ledger.domain.delivery.ordering import OrderRelease

    resolved: set[str] = set()

    async def recheck(ids: list[str]) -> list[str]:
        return [i for i in ids if i not in resolved]

    async def main() -> None:
        pacer = Pacer(order_wait=0.3, poll=0.02, recheck=recheck)
        pacer.add_platform("telegram", RateLimits(per_chat=Limit(1, 0.2)))
        target = DeliveryTarget(platform="telegram", chat_id="148")
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        pacer.load_foreign(
            [("stuck", target, t0), ("other-gateway", target, t0 + timedelta(seconds=1))]
        )
        mine = pacer.enter("mine", target, t0 + timedelta(seconds=2))
        started = time.monotonic()
        waiting = asyncio.create_task(pacer.turn(mine))
        await asyncio.sleep(0.6)  # the bound (0.3 s) is past for the stuck reply
        assert not waiting.done()  # still behind the live gateway's reply
        resolved.add("other-gateway")  # the other gateway delivered it
        turn = await waiting
        assert turn.released == (("stuck", OrderRelease.TIMEOUT),)
        assert time.monotonic() - started >= 0.6
        assert pacer.places["stuck"].state != FOREIGN
        # the other gateway just sent to this chat: its window counts as full
        waited, why = await pacer.hand_off(target)
        assert why == "rate" and waited > 0.1

    asyncio.run(main())


def test_a_chats_window_counts_a_send_from_when_it_came_back() -> None:
    """The platform has a send by the time it answers: the next send to the chat waits
    a window from then, however long the first was held between the count and the
    platform (a busy CPU: a CI run of ``simulate`` beside ten read commands)."""
    from gateway_ledger.application.delivery.pacing import Pacer

    async def main() -> None:
        pacer = Pacer(order_wait=60.0)
        pacer.add_platform("slack", RateLimits(per_chat=Limit(1, 0.2)))
        chat = DeliveryTarget(platform="slack", chat_id="C1")
        await pacer.hand_off(chat)
        await asyncio.sleep(0.15)  # held before it reached the platform, then answered
        pacer.answered(chat)
        answered_at = time.monotonic()
        waited, why = await pacer.hand_off(chat)
        assert why == "rate" and waited > 0.15  # a window from the answer, not from the count
        assert time.monotonic() - answered_at >= 0.2
        # another chat's window is its own
        other = DeliveryTarget(platform="slack", chat_id="C2")
        assert await pacer.hand_off(other) == (0.0, "")

    asyncio.run(main())


def test_what_runs_before_a_hand_off_holds_the_bots_turn_and_the_count_comes_after_it() -> None:
    """ADR 0070: a recovered reply records that its send starts inside ``hand_off``,
    once the hand-off fits: nobody else's hand-off on that bot goes meanwhile, and the
    instant counted (the chat's window) is after the record, not before it."""
    from gateway_ledger.application.delivery.pacing import Pacer

    async def main() -> None:
        pacer = Pacer(order_wait=60.0)
        pacer.add_platform("telegram", RateLimits(per_chat=Limit(1, 0.2)))
        chat = DeliveryTarget(platform="telegram", chat_id="1")
        other = DeliveryTarget(platform="telegram", chat_id="2")
        events: list[tuple[str, float]] = []

        async def record_start() -> None:
            events.append(("before", time.monotonic()))
            await asyncio.sleep(0.1)  # a durable write
            events.append(("recorded", time.monotonic()))

        async def first() -> None:
            await pacer.hand_off(chat, before=record_start)
            events.append(("first counted", time.monotonic()))

        async def second() -> None:
            await asyncio.sleep(0.02)  # queues while the first holds the bot's turn
            await pacer.hand_off(other)
            events.append(("second counted", time.monotonic()))

        await asyncio.gather(first(), second())
        order = [name for name, _ in events]
        assert order == ["before", "recorded", "first counted", "second counted"]
        recorded = dict(events)["recorded"]
        _, why = await pacer.hand_off(chat)  # a window from the count, after the record
        assert why == "rate" and time.monotonic() - recorded >= 0.2

    asyncio.run(main())


def test_status_shows_the_bot_pauses_and_the_gateways_sharing_each_bot(
    store_location: str,
) -> None:
    """``gateway-ledger status --json`` reads the shared budget's rows (ADR 0060) in one
    read: the pauses in force and how many gateways share each platform's bot; a store
    no gateway shared a budget on shows none."""
    cli = str(Path(sys.executable).parent / "gateway-ledger")

    def pacing() -> dict[str, Any]:
        done = subprocess.run(
            [cli, "status", "--json", "--db", store_location],
            capture_output=True, text=True, timeout=120, env={**os.environ},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        found: dict[str, Any] = json.loads(done.stdout)["pacing"]
        return found

    ledger = DeliveryLedger.open(store_location)
    try:
        assert pacing() == {"queued": {}, "pauses": {}, "sharing": {}}
        budget = SharedBudget.of(ledger)
        me = ledger.owner
        other = OwnerIdentity(
            host=me.host, boot_id=me.boot_id, pid=me.pid, start_time=me.start_time,
            installation_id="another-gateway",
        )  # fmt: skip
        budget.renew(me, ["telegram"], ttl=600)
        budget.renew(other, ["telegram", "slack"], ttl=600)
        budget.pause("telegram", 300)
        shown = pacing()
        assert shown["sharing"] == {"slack": 1, "telegram": 2}
        assert list(shown["pauses"]) == ["telegram"] and 200 < shown["pauses"]["telegram"] <= 300
    finally:
        ledger.close()


def test_a_reply_is_held_only_while_an_earlier_one_to_its_chat_is_unresolved() -> None:
    """``Pacer.holds`` is the one rule ``turn`` waits on and ``would_wait`` reports, and
    what lets a sender skip its turn when nothing is ahead: an earlier reply to the same
    chat holds a later one until it leaves; a reply to another chat is never held."""
    from datetime import UTC, datetime

    from gateway_ledger.application.delivery.pacing import NO_WAIT, Pacer

    async def main() -> None:
        pacer = Pacer(order_wait=60.0)
        chat = DeliveryTarget(platform="telegram", chat_id="148")
        other = DeliveryTarget(platform="telegram", chat_id="149")
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        first = pacer.enter("first", chat, t0)
        assert not pacer.holds(first)
        assert await pacer.turn(first) is NO_WAIT
        second = pacer.enter("second", chat, t0 + timedelta(seconds=1))
        elsewhere = pacer.enter("elsewhere", other, t0 + timedelta(seconds=1))
        assert pacer.holds(second) and pacer.would_wait(second, chat)
        assert not pacer.holds(first) and not pacer.holds(elsewhere)
        waiting = asyncio.create_task(pacer.turn(second))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # held by the first
        pacer.leave(first)
        assert not pacer.holds(second)
        turn = await asyncio.wait_for(waiting, 5)
        assert turn.released == ()

    asyncio.run(main())
