"""The writer wakes waiting loops through an eventfd (ADR 0020): in order, and no fd leaks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.loop_waker import waker_for


def eventfds() -> int:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, closed meanwhile
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
    return sum(1 for target in fds if "eventfd" in target)


def test_a_waker_settles_on_its_loop_in_the_order_woken() -> None:
    settled: list[tuple[int, BaseException | None, int]] = []

    def settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
        for waiter in waiters:
            settled.append((id(waiter), error, threading.get_ident()))
            waiter.set_result(None)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waker = waker_for(loop, settle)
        assert waker is not None  # Linux, selector loop
        waiters = [loop.create_future() for _ in range(50)]
        failure = RuntimeError("x")

        def from_another_thread() -> None:
            for i, waiter in enumerate(waiters):
                waker.wake([waiter], failure if i == 7 else None)

        thread = threading.Thread(target=from_another_thread)
        thread.start()
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        thread.join()
        assert [s[0] for s in settled] == [id(w) for w in waiters]  # order kept
        assert {s[2] for s in settled} == {threading.get_ident()}  # on the loop's thread
        assert settled[7][1] is failure
        waker.close()

    asyncio.run(main())


def test_a_writer_serves_one_loop_after_another_and_closes_their_eventfds(
    tmp_path: Path,
) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger)
    before = eventfds()

    async def record(oid: str) -> None:
        agg = ledger.new_obligation(
            obligation_id=oid, session_key="agent:main:cli:dm:1", platform="cli",
            chat_id="1", content="hi",
        )  # fmt: skip
        await writer.write(agg.collect_events())

    for i in range(3):  # a new loop each time, as asyncio.run does
        asyncio.run(record(f"o-{i}"))
    assert eventfds() == before + 3  # one per loop that waited
    writer.close()
    assert all(ledger.exists(f"o-{i}") for i in range(3))
    assert eventfds() == before
