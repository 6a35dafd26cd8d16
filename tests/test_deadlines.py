"""One timer for every ledger wait (application/delivery/deadlines.py)."""

from __future__ import annotations

import asyncio
import time

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
    """A busy gateway's settled waits are not held until the timer fires: the deque holds
    about the waits in flight, so no reply's waiter outlives its wait by seconds."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(60.0)
        in_flight: list[asyncio.Future[None]] = []
        for n in range(1000):
            waiter: asyncio.Future[None] = loop.create_future()
            deadlines.watch(waiter)
            in_flight.append(waiter)
            if n % 8 == 7:  # eight wait together, then their group commits
                for settled in in_flight:
                    settled.set_result(None)
                in_flight.clear()
            assert deadlines.held() <= 9
        slow: asyncio.Future[None] = loop.create_future()
        deadlines.watch(slow)
        assert deadlines.held() == 1  # only the wait still in flight
        deadlines.close()

    asyncio.run(main())
