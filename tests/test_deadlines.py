"""One timer for every ledger wait (application/delivery/deadlines.py)."""

from __future__ import annotations

import asyncio
import time
import weakref

import pytest

from gateway_ledger.application.delivery.deadlines import Deadlines


def test_a_wait_past_its_deadline_ends_in_timeout_after_many_that_settled_in_time() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(0.05)
        for _ in range(1000):  # a busy gateway: every wait settles in time
            waiter: asyncio.Future[None] = loop.create_future()
            deadlines.watch(waiter)
            waiter.set_result(None)
            await waiter
        slow: asyncio.Future[None] = loop.create_future()
        started = time.monotonic()
        deadlines.watch(slow)
        with pytest.raises(TimeoutError):
            await slow
        assert 0.04 <= time.monotonic() - started < 1.0
        deadlines.close()

    asyncio.run(main())


def test_waits_that_settled_are_let_go_before_their_deadline() -> None:
    """A busy gateway's settled waits are not held until the timer fires: once a group has
    committed, the next wait lets its waiters go, so no reply's waiter outlives its wait by
    seconds (held, they were promoted to the collector's oldest generation)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(60.0)
        settled: list[weakref.ReferenceType[asyncio.Future[None]]] = []
        for _ in range(125):  # eight wait together, then their group commits
            group: list[asyncio.Future[None]] = [loop.create_future() for _ in range(8)]
            for waiter in group:
                deadlines.watch(waiter)
            for waiter in group:
                waiter.set_result(None)
            settled.extend(weakref.ref(waiter) for waiter in group)
            del group, waiter
        slow: asyncio.Future[None] = loop.create_future()
        deadlines.watch(slow)
        assert [ref for ref in settled if ref() is not None] == []  # freed, not held
        deadlines.close()

    asyncio.run(main())
