"""Settle before re-sending (ADR 0050): the gateway asks a reconciling adapter what
arrived before it repeats an uncertain send, records the answer, and never lets a bad
answer (raised, slow, nonsense) cost a lost reply or an unlabelled duplicate."""

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
from gateway_ledger.application.delivery.reconciliation import ReconcileAnswer, ReconcileQuery
from gateway_ledger.application.delivery.scheduling import ManualScheduler
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.delivery.reconciliation import ReconcileOutcome
from tests.gateway_fakes import ScriptedAdapter, dead_owner

KEY = "agent:main:whatsapp:dm:7"
CTX = ReplyContext(session_key=KEY, platform="whatsapp", chat_id="7")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


class ReconcilingAdapter(ScriptedAdapter):
    """A scripted platform that also answers reconciliation: each question gets the next
    scripted answer (an exception is raised; ``"slow"`` answers after a minute; ``"truth"``
    answers from what arrived, by the key it was sent with)."""

    def __init__(self, answers: list[Any], script: list[Any] | None = None) -> None:
        super().__init__("whatsapp", script or [])
        self.answers = list(answers)
        self.queries: list[ReconcileQuery] = []

    async def reconcile(self, query: ReconcileQuery) -> Any:
        self.queries.append(query)
        answer = self.answers.pop(0) if self.answers else "truth"
        if isinstance(answer, BaseException):
            raise answer
        if answer == "slow":
            await asyncio.sleep(60)
        if answer == "truth":
            if any(s.idempotency_key == query.key for s in self.arrived):
                return ReconcileAnswer.arrived("found-1", evidence="nonce found")
            return ReconcileAnswer.not_arrived("no message with that nonce")
        return answer


def history(gw: Gateway, oid: str) -> list[tuple[str, dict[str, Any]]]:
    return [(h.type, h.fields) for h in gw.ledger.history(oid)]


def reconciled(gw: Gateway, oid: str) -> list[str]:
    return [f["outcome"] for t, f in history(gw, oid) if t == "Reconciled"]


async def ambiguous_then_retry(
    store_location: str, adapter: ReconcilingAdapter, **kwargs: Any
) -> tuple[Gateway, str, ManualScheduler]:
    clock = ManualScheduler()
    gw = Gateway.open(store_location, scheduler=clock, **kwargs)
    await gw.start([adapter])
    out = await gw.deliver(CTX, Reply("hello"), "in-1")
    assert (out.status, out.error_class) == ("failed", "ambiguous")
    await clock.advance(30)
    await gw.flush()
    assert out.obligation_id is not None
    return gw, out.obligation_id, clock


def test_arrived_settles_delivered_with_the_receipt_and_sends_nothing(
    store_location: str,
) -> None:
    async def main() -> None:
        # The send arrived, then the response was lost (the exception after arrival).
        class LostResponse(ReconcilingAdapter):
            async def send(self, *args: Any, **kwargs: Any) -> SendResult:
                result = await super().send(*args, **kwargs)
                if len(self.sent) == 1:
                    raise TimeoutError("response lost after the message arrived")
                return result

        adapter = LostResponse(["truth"])
        gw, oid, _ = await ambiguous_then_retry(store_location, adapter)
        assert len(adapter.sent) == 1  # no re-send
        assert adapter.queries[0].key == oid  # the key placed on the send
        assert adapter.sent[0].idempotency_key == oid
        status = gw.ledger.get(oid)
        assert status.state == "delivered" and status.receipt == ("found-1",)
        assert reconciled(gw, oid) == ["arrived"]
        events = history(gw, oid)
        assert [t for t, _ in events][-2:] == ["Reconciled", "Delivered"]
        fields = events[-2][1]
        assert fields["by"] == gw.owner and fields["fence"] == 0
        assert fields["evidence"] == "nonce found"
        audit = gw.ledger.audit_duplicates()
        assert audit.ok and audit.avoided_duplicates == 1 and not audit.possible_duplicates
        assert gw.stats().reconciled_arrived == 1
        await gw.close()

    run(main())


def test_not_arrived_resends_without_the_marker(store_location: str) -> None:
    async def main() -> None:
        adapter = ReconcilingAdapter(["truth"], script=[TimeoutError("before it left")])
        gw, oid, _ = await ambiguous_then_retry(store_location, adapter)
        assert [s.content for s in adapter.sent] == ["hello", "hello"]  # plain
        assert reconciled(gw, oid) == ["not_arrived"]
        guards = [f["guard"] for t, f in history(gw, oid) if t == "Attempting"]
        assert guards == ["none", "none"]
        assert gw.ledger.get(oid).state == "delivered"
        audit = gw.ledger.audit_duplicates()
        assert audit.ok and audit.avoided_duplicates == 1 and not audit.possible_duplicates
        await gw.close()

    run(main())


def test_unknown_resends_with_the_marker_as_before(store_location: str) -> None:
    async def main() -> None:
        adapter = ReconcilingAdapter(
            [ReconcileAnswer.unknown("cannot tell")], script=[TimeoutError("timeout")]
        )
        gw, oid, _ = await ambiguous_then_retry(store_location, adapter)
        assert adapter.sent[1].content == f"{DUPLICATE_NOTICE}\nhello"
        assert reconciled(gw, oid) == ["unknown"]
        audit = gw.ledger.audit_duplicates()
        assert audit.ok and audit.labelled_duplicates == 1 and audit.avoided_duplicates == 0
        await gw.close()

    run(main())


HOSTILE = [
    pytest.param(RuntimeError("platform down"), id="raises"),
    pytest.param("slow", id="slower-than-the-deadline"),
    pytest.param(ReconcileAnswer(ReconcileOutcome.ARRIVED), id="arrived-without-ids"),
    pytest.param(ReconcileAnswer(ReconcileOutcome.NOT_ARRIVED, ("x",)), id="ids-not-arrived"),
    pytest.param(ReconcileAnswer.arrived(""), id="empty-id"),
    pytest.param(ReconcileAnswer.arrived("x" * 500), id="id-too-long"),
    pytest.param({"outcome": "arrived"}, id="not-an-answer"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("answer", HOSTILE)
def test_a_hostile_adapter_counts_as_unknown_logged_and_counted(
    store_location: str, answer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        adapter = ReconcilingAdapter([answer], script=[TimeoutError("timeout")])
        started = asyncio.get_running_loop().time()
        gw, oid, _ = await ambiguous_then_retry(store_location, adapter, reconcile_deadline=0.2)
        assert asyncio.get_running_loop().time() - started < 5  # never past its deadline
        assert adapter.sent[1].content == f"{DUPLICATE_NOTICE}\nhello"  # labelled, not lost
        assert gw.ledger.get(oid).state == "delivered"
        assert reconciled(gw, oid) == ["unknown"]
        stats = gw.stats()
        assert (stats.reconcile_bad_answers, stats.reconciled_unknown) == (1, 1)
        audit = gw.ledger.audit_duplicates()
        assert audit.ok and audit.unlabelled_duplicates == 0
        await gw.close()

    run(main())
    assert "counted as unknown" in caplog.text


def test_a_slow_answer_does_not_block_the_loop(store_location: str) -> None:
    async def main() -> None:
        adapter = ReconcilingAdapter(["slow"], script=[TimeoutError("timeout")])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock, reconcile_deadline=0.5) as gw:
            await gw.start([adapter])
            await gw.deliver(CTX, Reply("hello"), "in-1")
            retry = asyncio.create_task(clock.advance(30))
            ticks = 0
            while not retry.done():
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks >= 20  # the loop ran all along the half second

    run(main())


def test_an_arrival_naming_another_parts_receipt_is_unknown(store_location: str) -> None:
    async def main() -> None:
        reply = Reply("aaabbb", parts=("aaa", "bbb"))
        adapter = ReconcilingAdapter(
            [ReconcileAnswer.arrived("p0")], script=[SendResult.ok("p0"), TimeoutError("t")]
        )
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, reply, "in-1")
            await clock.advance(30)
            await gw.flush()
            assert adapter.queries[0].key == f"{out.obligation_id}:1"
            assert adapter.queries[0].part == 1
            assert adapter.sent[-1].content == f"{DUPLICATE_NOTICE}\nbbb"
            assert gw.stats().reconcile_bad_answers == 1

    run(main())


def test_a_part_that_arrived_is_kept_and_only_the_rest_is_sent_plain(
    store_location: str,
) -> None:
    async def main() -> None:
        reply = Reply("aaabbbccc", parts=("aaa", "bbb", "ccc"))
        adapter = ReconcilingAdapter(
            [ReconcileAnswer.arrived("p1")], script=[SendResult.ok("p0"), TimeoutError("t")]
        )
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, reply, "in-1")
            await clock.advance(30)
            await gw.flush()
            assert [s.content for s in adapter.sent] == ["aaa", "bbb", "ccc"]
            status = gw.ledger.get(out.obligation_id)
            assert status.state == "delivered" and status.receipt[:2] == ("p0", "p1")
            assert gw.ledger.audit_duplicates().ok

    run(main())


def test_a_successful_send_asks_nothing_and_an_ambiguous_one_asks_once(
    store_location: str,
) -> None:
    async def main() -> None:
        adapter = ReconcilingAdapter(
            [ReconcileAnswer.unknown()],
            script=[SendResult.ok("a"), TimeoutError("t"), TimeoutError("t")],
        )
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            await gw.deliver(CTX, Reply("one"), "in-1")
            assert adapter.queries == []  # succeeded: no round trip
            await gw.deliver(CTX, Reply("two"), "in-2")
            await clock.advance(30)  # retry 1: asks (unknown), re-sends marked, times out
            await clock.advance(120)  # retry 2: asks once more for the second ambiguous send
            assert len(adapter.queries) == 2
            assert len(adapter.sent) == 4

    run(main())


def test_the_boot_sweep_asks_before_it_resends_and_settles_what_arrived(
    store_location: str,
) -> None:
    async def main() -> None:
        dead = Gateway.open(store_location, owner=dead_owner())
        hung = ReconcilingAdapter([], script=["hang"])
        await dead.start([hung])
        task = asyncio.create_task(dead.deliver(CTX, Reply("mid-send"), "in-1"))
        while not hung.sent:
            await asyncio.sleep(0.01)
        task.cancel()  # the process "dies" with the send in flight
        second = asyncio.create_task(dead.deliver(CTX, Reply("never left"), "in-2"))
        hung.script = ["hang"]
        while len(hung.sent) < 2:
            await asyncio.sleep(0.01)
        second.cancel()
        hung.arrived.pop()  # the second one never reached the platform
        await dead.close()

        adapter = ReconcilingAdapter([])
        adapter.arrived = list(hung.arrived)  # the platform's memory survives the crash
        async with Gateway.open(store_location) as gw:
            report = await gw.start([adapter])
            assert report.claimed == 2
            assert [s.content for s in adapter.sent] == ["never left"]  # plain, once
            await gw.flush()
            by_anchor = {
                r.obligation_id: gw.ledger.get(r.obligation_id).state
                for r in gw.ledger.list(state="delivered")
            }
            assert len(by_anchor) == 2
            audit = gw.ledger.audit_duplicates()
            assert audit.ok and audit.avoided_duplicates == 2
            assert audit.reconciled == {"arrived": 1, "not_arrived": 1, "unknown": 0}
            assert not audit.possible_duplicates

    run(main())


def test_an_adapter_without_the_capability_is_used_as_before(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter("whatsapp", [TimeoutError("t")])
        clock = ManualScheduler()
        async with Gateway.open(store_location, scheduler=clock) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            await clock.advance(30)
            await gw.flush()
            assert [s.idempotency_key for s in adapter.sent] == [None, None]
            assert adapter.sent[1].content.startswith(DUPLICATE_NOTICE)
            assert out.obligation_id is not None
            assert reconciled(gw, out.obligation_id) == []

    run(main())


def test_statuses_through_the_gateway_hook_and_the_console_script(tmp_path: Any) -> None:
    """A webhook's statuses reach the ledger through the hook the gateway hands an adapter;
    `list --status read`, `status`, `metrics` and `history` show them (real console)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    db = str(tmp_path / "ledger.db")

    class Webhooks(ScriptedAdapter):
        def attach_status_sink(self, sink: Any) -> None:
            self.sink = sink

    async def main() -> tuple[str, str]:
        adapter = Webhooks("whatsapp")
        clock = ManualScheduler()
        async with Gateway.open(db, scheduler=clock) as gw:
            await gw.start([adapter])
            read = await gw.deliver(CTX, Reply("one"), "in-1")
            dropped = await gw.deliver(CTX, Reply("two"), "in-2")
            assert adapter.sent[0].idempotency_key == read.obligation_id  # keyed for it
            assert await adapter.sink(read.obligation_id, "delivered_to_device", None, "", "m1")
            assert await adapter.sink(read.obligation_id, "read", None, "", "m1")
            assert not await adapter.sink(read.obligation_id, "delivered_to_device")  # late
            assert await adapter.sink(dropped.obligation_id, "failed_after_acceptance", None,
                                      "131026", "m2")  # fmt: skip
            await clock.advance(30)  # the reopened reply's re-send, plain
            assert [s.content for s in adapter.sent] == ["one", "two", "two"]
            stats = gw.stats()
            assert (stats.status_reports, stats.failed_after_acceptance) == (3, 1)
            assert read.obligation_id is not None and dropped.obligation_id is not None
            return read.obligation_id, dropped.obligation_id

    read_id, dropped_id = run(main())
    script = str(Path(sys.executable).parent / "gateway-ledger")
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_DB"}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [script, *args, "--db", db], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(cli("list", "--status", "read", "--json"))
    assert [e["obligation_id"] for e in listed["obligations"]] == [read_id]
    status = json.loads(cli("status", "--json"))
    assert status["failed_after_acceptance"] == 1
    assert status["by_platform_status"] == {"delivered_to_device": 0, "read": 1}
    assert "gateway_ledger_failed_after_acceptance_total 1" in cli("metrics")
    history = cli("history", dropped_id)
    assert "status=failed_after_acceptance" in history
    assert history.count("Attempting") == 2


def test_an_operators_retry_asks_before_it_resends(store_location: str) -> None:
    """`gateway-ledger retry` makes the reply claimable; the sweep that claims it asks
    the platform first, and re-sends plain when the platform proves nothing arrived."""
    from gateway_ledger.bootstrap import DeliveryLedger

    async def main() -> None:
        first = ReconcilingAdapter([], script=[TimeoutError("before it left")])
        clock = ManualScheduler()
        gw = Gateway.open(store_location, owner=dead_owner(), scheduler=clock)
        await gw.start([first])
        out = await gw.deliver(CTX, Reply("hello"), "in-1")
        assert out.obligation_id is not None and out.status == "failed"
        await gw.close()  # its runtime retries stop: the boot sweep owns it
        operator = DeliveryLedger.open(store_location, owner=dead_owner())
        operator.retry(out.obligation_id, "ops")
        operator.close()

        adapter = ReconcilingAdapter(["truth"])
        async with Gateway.open(store_location) as later:
            report = await later.start([adapter])
            assert report.claimed == 1
            assert [s.content for s in adapter.sent] == ["hello"]  # plain: it never arrived
            assert len(adapter.queries) == 1
            await later.flush()
            assert reconciled(later, out.obligation_id) == ["not_arrived"]
            assert later.ledger.audit_duplicates().ok

    run(main())
