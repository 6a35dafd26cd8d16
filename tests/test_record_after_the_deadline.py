"""A record that ended just as its deadline passed is taken as it ended.

The deadline of a reply's record (``ledger_deadline``) can fire after the writer has
already settled the write, before the reply's task looks at it. The gateway then took
the record for failed: the reply went on untracked, its later parts and ``Delivered``
were never written, and a claimer later re-sent those parts without the duplicate
marker (found by ``simulate --faults``, PostgreSQL seed 9: an unlabelled copy of a
media part). A record that landed is tracked; one refused because the same turn was
recorded by another gateway is not sent again. One whose session was forgotten while it
waited, made before the erasure, is not sent: its record will be refused (ADR 0073).

The writer here is the real group-commit writer on a real store; only the caller's
wait is made to end in ``TimeoutError`` once the write has ended, the race's outcome.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from gateway_ledger.application.delivery.flight import DeliveryOutcome
from gateway_ledger.application.delivery.ports import Reply
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.errors import NotFound
from gateway_ledger.domain.values import MediaItem
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from tests.conftest import close_left_open
from tests.gateway_fakes import ScriptedAdapter
from tests.gateway_support import CTX, deliver_one

IMAGE = MediaItem(kind="image", uri="file:///cat.png")


class DeadlinePassedAsItLanded(GroupCommitWriter):
    """The real writer; the first waited-for write's caller sees ``TimeoutError``, raised
    only once that write has ended (landed or refused)."""

    def __init__(self, ledger: DeliveryLedger) -> None:
        super().__init__(ledger)
        self.raced = False

    def submit_waiting(self, events: Sequence[Any], **kwargs: Any) -> Any:
        handle, waiter = super().submit_waiting(events, **kwargs)
        if self.raced:
            return handle, waiter
        self.raced = True
        late: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def deadline_passed(_: asyncio.Future[None]) -> None:
            late.set_exception(TimeoutError("the ledger write is slower than ledger_deadline"))

        waiter.add_done_callback(deadline_passed)
        return handle, late


def test_a_record_that_landed_as_its_deadline_passed_is_tracked_to_the_end(
    store_location: str,
) -> None:
    async def main() -> None:
        ledger = DeliveryLedger.open(store_location)
        adapter = ScriptedAdapter()
        async with Gateway(ledger, writer=DeadlinePassedAsItLanded(ledger)) as gw:
            await gw.start([adapter])
            out = await gw.deliver(CTX, Reply("two parts", media=(IMAGE,)), "in-1")
            await gw.flush()
            assert out.status == "delivered"
            stats = gw.stats()
            assert stats.ledger_faults == 1  # the deadline passed: still said
            assert stats.untracked == 0
            types = [h.type for h in gw.ledger.history(out.obligation_id)]
            assert types == ["Recorded", "Attempting", "PartDelivered", "Delivered"]
            assert gw.ledger.get(out.obligation_id).state == "delivered"
        assert len(adapter.sent) == 2

    asyncio.run(main())
    close_left_open()


def test_a_record_refused_as_its_deadline_passed_is_not_sent_again(
    store_location: str,
) -> None:
    """The same turn's reply was recorded and delivered by another gateway: this one's
    record is refused (a conflict), and the reply is not sent a second time."""

    async def main() -> None:
        await deliver_one(store_location, "once", "in-1")  # by another gateway
        ledger = DeliveryLedger.open(store_location)
        second = ScriptedAdapter()
        async with Gateway(ledger, writer=DeadlinePassedAsItLanded(ledger)) as gw:
            await gw.start([second])
            again = await gw.deliver(CTX, Reply("once"), "in-1")
            assert again.status == "already_recorded", again
            assert gw.stats().untracked == 0
        assert second.sent == []

    asyncio.run(main())
    close_left_open()


class ErasedWhileTheRecordWaits(GroupCommitWriter):
    """The real writer. The first waited-for write is held in the writer thread: the
    session is forgotten there, then its caller's wait ends in ``TimeoutError`` as the
    gateway's deadline ends it (the write still pending), and the write goes on, to be
    refused, once the reply's task has ended."""

    def __init__(self, ledger: DeliveryLedger, session_key: str, *, forget: bool = True) -> None:
        super().__init__(ledger, append=self._held_append)
        self.ledger = ledger
        self.session_key = session_key
        self.forget = forget
        self.task_ended = threading.Event()
        self._first: asyncio.Future[None] | None = None
        self._store = ledger.events.append

    def submit_waiting(self, events: Sequence[Any], **kwargs: Any) -> Any:
        handle, waiter = super().submit_waiting(events, **kwargs)
        if self._first is None:
            self._first = waiter
        return handle, waiter

    def _held_append(self, events: Sequence[Any]) -> None:
        waiter = self._first
        if waiter is not None and not self.task_ended.is_set():
            if self.forget:
                self.ledger.forget_session(self.session_key)  # while the record waits
            timeout = TimeoutError("the ledger write is slower than ledger_deadline")
            waiter.get_loop().call_soon_threadsafe(waiter.set_exception, timeout)
            self.task_ended.wait(10)  # the reply's task went on without this write
        self._store(events)


async def deliver_while_the_record_waits(
    gw: Gateway, writer: ErasedWhileTheRecordWaits, text: str
) -> DeliveryOutcome:
    """Deliver one reply whose record ``writer`` holds; once the reply's task ended, let
    the record go on, and return when its end has been told (a later write has landed)."""
    try:
        out = await gw.deliver(CTX, Reply(text), "in-1")
    finally:
        writer.task_ended.set()
    await writer.write([])
    return out


def test_a_reply_whose_session_was_forgotten_while_its_record_waited_is_not_sent(
    store_location: str,
) -> None:
    """The record outlived its deadline, and the session was forgotten meanwhile: the
    reply was made before the erasure, so it is not sent (ADR 0073), and its record is
    refused when it comes. Before, the ownership check found nothing recorded and sent."""

    async def main() -> None:
        ledger = DeliveryLedger.open(store_location)
        adapter = ScriptedAdapter()
        writer = ErasedWhileTheRecordWaits(ledger, CTX.session_key)
        async with Gateway(ledger, writer=writer) as gw:
            await gw.start([adapter])
            out = await deliver_while_the_record_waits(gw, writer, "from a forgotten conversation")
            assert out.status == "erased", out
            stats = gw.stats()
            assert stats.erased == 1
            assert stats.untracked == 0  # nothing went out, untracked or not
            assert stats.ledger_faults == 1  # the deadline passed; the refusal is no fault
            with pytest.raises(NotFound):
                gw.ledger.get(out.obligation_id)  # the record was refused
        assert adapter.sent == []

    asyncio.run(main())
    close_left_open()


def test_a_reply_made_after_its_session_was_forgotten_is_sent_while_its_record_waits(
    store_location: str,
) -> None:
    """The same wait, for a reply made after the erasure: it belongs to a new conversation
    (ADR 0071's time rule), goes out, and its record lands under a new key."""

    async def main() -> None:
        await deliver_one(store_location, "before", "in-0")
        ledger = DeliveryLedger.open(store_location)
        ledger.forget_session(CTX.session_key)
        adapter = ScriptedAdapter()
        writer = ErasedWhileTheRecordWaits(ledger, CTX.session_key, forget=False)
        async with Gateway(ledger, writer=writer) as gw:
            await gw.start([adapter])
            out = await deliver_while_the_record_waits(gw, writer, "a new conversation")
            await gw.flush()
            assert out.status == "delivered", out
            stats = gw.stats()
            assert (stats.erased, stats.untracked, stats.ledger_faults) == (0, 0, 1)
            assert gw.ledger.get(out.obligation_id).state == "delivered"
        assert [sent.content for sent in adapter.sent] == ["a new conversation"]

    asyncio.run(main())
    close_left_open()
