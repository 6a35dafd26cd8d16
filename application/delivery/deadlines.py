"""One timer for every ledger wait: waits that outlive ``ledger_deadline`` end in TimeoutError.

Each delivery waits twice for the writer. A ``call_later`` per wait costs a heap push,
a cancel, and a heap full of cancelled handles when 64 conversations wait at once.
Every wait here has the same length, so deadlines expire in the order they were set:
a deque and a single timer, re-armed for the oldest wait still pending, do the job in
O(1) per wait. The waited-for write itself is never cancelled; only the wait ends.

Waits that settled are let go at the next ``watch``, not when the oldest deadline's timer
fires: the deque then holds about the waits in flight, not every wait of the last
``ledger_deadline`` seconds. Held that long, each reply's waiter and its entry outlived the
collector's young generations, were promoted to the oldest, and made every full collection
walk thousands of them (docs/performance.md, round 14). Only the head is looked at, to
stay O(1): behind a wait still pending, settled ones stay until it ends, at most
``ledger_deadline`` later.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Deadlines:
    """Fails a waiter with ``TimeoutError`` once it has waited ``seconds`` (loop thread only)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._waiting: deque[tuple[float, asyncio.Future[None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, waiter: asyncio.Future[None]) -> None:
        loop = waiter.get_loop()
        self._let_go_settled()
        self._waiting.append((loop.time() + self.seconds, waiter))
        if self._timer is None:
            self._arm(loop)

    def _let_go_settled(self) -> None:
        """Drop the waits at the head that settled in time: nothing is left to watch."""
        waiting = self._waiting
        while waiting and waiting[0][1].done():
            waiting.popleft()

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._let_go_settled()
        waiting = self._waiting
        self._timer = loop.call_at(waiting[0][0], self._expire, loop) if waiting else None

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        waiting = self._waiting
        while waiting and (waiting[0][0] <= now or waiting[0][1].done()):
            _, waiter = waiting.popleft()
            if not waiter.done():
                waiter.set_exception(
                    TimeoutError("the ledger write is slower than ledger_deadline")
                )
        self._arm(loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()
