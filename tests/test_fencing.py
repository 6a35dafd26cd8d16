"""Fencing (ADR 0006, 0010): a fenced-out owner never starts a send; its results are late facts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.application.delivery.scheduling import ManualScheduler
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.domain.values import DeliveryTarget, ErrorClass, MediaItem, OwnerIdentity

A = OwnerIdentity(host="gw-a", boot_id="b", pid=11, start_time=1, installation_id="inst-a")
B = OwnerIdentity(host="gw-b", boot_id="b", pid=22, start_time=2, installation_id="inst-b")
CTX = ReplyContext(session_key="agent:main:telegram:dm:5", platform="telegram", chat_id="5")


def everyone_dead(_: OwnerIdentity) -> bool:
    return False


def record(ledger: DeliveryLedger, oid: str = "o-1") -> str:
    return ledger.record_obligation(
        obligation_id=oid,
        session_key="agent:main:telegram:dm:5",
        platform="telegram",
        chat_id="5",
        content="the answer",
    )


def types(ledger: DeliveryLedger, oid: str) -> list[str]:
    return [h.type for h in ledger.history(oid)]


def test_a_fenced_out_owner_cannot_start_a_send_and_its_results_are_late_facts(
    store_location: str,
) -> None:
    a = DeliveryLedger.open(store_location, owner=A)
    b = DeliveryLedger.open(store_location, owner=B)
    oid = record(a)
    a.mark_attempting(oid)
    (won,) = b.sweep_recoverable(liveness=everyone_dead)
    assert won["needs_marker"] is True
    with pytest.raises(IllegalTransition):
        a.mark_attempting(oid)  # claimed: not A's to send
    b.mark_failed(oid, "timeout", "ambiguous")
    with pytest.raises(IllegalTransition, match="fenced out"):
        a.mark_attempting(oid)  # failed, but the owner is B now
    a.mark_delivered(oid, ["m-late"])  # A's send did arrive after all
    status = a.get(oid)
    assert (status.state, status.owner, status.fence) == ("failed", B, 1)
    late = a.history(oid)[-1]
    assert late.type == "LateResultReported"
    assert late.fields["late"] is True and late.fields["outcome"] == "delivered"
    assert (late.fields["by"], late.fields["receipt"]) == (A, ["m-late"])
    assert (late.fields["fence"], late.fields["current_fence"]) == (None, 1)
    assert late.to_dict()["fields"]["late"] is True  # what `audit duplicates` reads
    b.mark_attempting(oid)
    b.mark_delivered(oid, ["m-b"])
    a.mark_failed(oid, "reset", "ambiguous")  # accepted even after the final state
    assert types(a, oid) == [
        "Recorded",
        "Attempting",
        "Claimed",
        "Failed",
        "LateResultReported",
        "Attempting",
        "Delivered",
        "LateResultReported",
    ]
    assert a.get(oid).state == "delivered" and a.get(oid).receipt == ("m-b",)


def test_an_explicit_fence_decides_and_a_late_delivery_forces_the_marker(
    store_location: str,
) -> None:
    a = DeliveryLedger.open(store_location, owner=A)
    b = DeliveryLedger.open(store_location, owner=B)
    oid = record(a)
    a.mark_attempting(oid)
    a.mark_failed(oid, "refused", "rejected")
    assert a.get(oid).needs_marker is False
    b.sweep_recoverable(liveness=everyone_dead)
    b.mark_failed(oid, "refused", "rejected", fence=1)  # the claimer's own send: no arrival
    assert a.get(oid).needs_marker is False
    a.mark_delivered(oid, "m-a", fence=0)  # stale fence: late, but it proves arrival
    assert a.get(oid).needs_marker is True
    assert a.history(oid)[-1].fields["fence"] == 0
    b.mark_attempting(oid)
    b.mark_failed(oid, "refused", "rejected")
    assert a.get(oid).needs_marker is True  # a refusal of B's send cannot undo A's arrival


def test_a_late_receipt_is_sealed_like_any_receipt(store_location: str) -> None:
    a = DeliveryLedger.open(store_location, owner=A)
    b = DeliveryLedger.open(store_location, owner=B)
    oid = record(a)
    a.mark_attempting(oid)
    b.sweep_recoverable(liveness=everyone_dead)
    a.mark_delivered(oid, ["platform-msg-98765"])
    stored = a.recorder.select_events(a.aggregate_id(oid))
    assert b"platform-msg-98765" not in stored[-1].state
    assert a.history(oid)[-1].fields["receipt"] == ["platform-msg-98765"]


class GatedAdapter(AdapterBase):
    """Each send waits for the test to open its gate, then returns the scripted result."""

    def __init__(self, results: Sequence[SendResult] = ()) -> None:
        self.platform = "telegram"
        self.supports_idempotency = False
        self.results = list(results)
        self.sent: list[str] = []
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

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
        self.sent.append(content)
        self.started.set()
        await self.gate.wait()
        self.gate.clear()
        return self.results.pop(0) if self.results else SendResult.ok(f"m{len(self.sent)}")


async def claim_while_sending(store_location: str, adapter: GatedAdapter) -> DeliveryLedger:
    await adapter.started.wait()
    adapter.started.clear()
    other = DeliveryLedger.open(store_location, owner=B)
    assert len(await asyncio.to_thread(other.sweep_recoverable, liveness=everyone_dead)) == 1
    adapter.gate.set()
    return other


def test_a_gateway_claimed_mid_send_records_its_delivery_late(store_location: str) -> None:
    async def main() -> None:
        adapter = GatedAdapter()
        async with Gateway.open(store_location, owner=A) as gw:
            await gw.start([adapter])
            sending = asyncio.create_task(gw.deliver(CTX, Reply("hello"), "in-1"))
            other = await claim_while_sending(store_location, adapter)
            out = await sending
            assert out.status == "delivered"  # it did reach the user
            await gw.flush()  # Delivered is written behind: its lost race shows when it lands
            assert gw.stats().late_results == 1
            assert types(other, out.obligation_id) == [
                "Recorded",
                "Attempting",
                "Claimed",
                "LateResultReported",
            ]
            status = other.get(out.obligation_id)
            assert (status.state, status.owner) == ("claimed", B)  # B decides what is next

    asyncio.run(main())


def test_a_gateway_claimed_before_its_retry_never_sends_again(store_location: str) -> None:
    async def main() -> None:
        adapter = GatedAdapter([SendResult.failed(ErrorClass.AMBIGUOUS, "timeout")])
        clock = ManualScheduler()
        async with Gateway.open(store_location, owner=A, scheduler=clock) as gw:
            await gw.start([adapter])
            adapter.gate.set()
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert (out.status, out.retry_in) == ("failed", 30.0)
            other = DeliveryLedger.open(store_location, owner=B)
            assert len(other.sweep_recoverable(liveness=everyone_dead)) == 1
            adapter.gate.set()
            assert await clock.advance(30) == 1
            assert adapter.sent == ["hello"]  # the retry found itself fenced out: no send
            assert types(other, out.obligation_id) == [
                "Recorded",
                "Attempting",
                "Failed",
                "Claimed",
            ]

    asyncio.run(main())


def test_a_multi_part_reply_stops_at_the_part_where_it_was_claimed(store_location: str) -> None:
    async def main() -> None:
        adapter = GatedAdapter()
        async with Gateway.open(store_location, owner=A) as gw:
            await gw.start([adapter])
            reply = Reply("part one|part two", parts=("part one|", "part two"))
            sending = asyncio.create_task(gw.deliver(CTX, reply, "in-1"))
            other = await claim_while_sending(store_location, adapter)
            out = await sending
            assert out.status == "superseded" and out.message_ids == ("m1",)
            assert adapter.sent == ["part one|"]  # the second part is the claimer's to send
            late = other.history(out.obligation_id)[-1]
            assert late.type == "LateResultReported"
            assert (late.fields["outcome"], late.fields["part"]) == ("part_delivered", 0)

    asyncio.run(main())


def test_the_duplicate_audit_flags_a_late_result(store_location: str) -> None:
    a = DeliveryLedger.open(store_location, owner=A)
    b = DeliveryLedger.open(store_location, owner=B)
    oid = record(a)
    a.mark_attempting(oid)
    b.sweep_recoverable(liveness=everyone_dead)
    b.mark_delivered(oid, ["m-b"])
    a.mark_delivered(oid, ["m-a"])
    report = b.audit_duplicates()
    late = [f for f in report.findings if f.kind == "late_result"]
    assert len(late) == 1 and not report.ok
