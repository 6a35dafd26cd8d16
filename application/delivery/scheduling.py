"""When runtime retries happen: injectable, so tests never wait 30 s for a backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

log = logging.getLogger("gateway_ledger.scheduling")

Job = Callable[[], Coroutine[Any, Any, None]]


class Scheduler(Protocol):
    def schedule(self, delay: float, job: Job, *, label: str = "") -> None: ...

    async def close(self) -> None: ...


class AsyncioScheduler:
    """Real time on the running loop; ``close`` cancels what has not started."""

    def __init__(self) -> None:
        self._handles: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self, delay: float, job: Job, *, label: str = "") -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._handles.discard(handle)
            task: asyncio.Task[None] = loop.create_task(job(), name=label or None)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        handle = loop.call_later(max(0.0, delay), fire)
        self._handles.add(handle)

    @property
    def pending(self) -> int:
        return len(self._handles) + len(self._tasks)

    async def idle(self) -> None:
        """Wait until nothing is scheduled or running (used by the simulator)."""
        while self._handles or self._tasks:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            else:
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        for handle in list(self._handles):
            handle.cancel()
        self._handles.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class ManualScheduler:
    """For tests: records every delay and runs jobs only when told to."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[tuple[str, float]] = []
        self._queue: list[tuple[float, int, Job]] = []
        self._seq = 0

    def schedule(self, delay: float, job: Job, *, label: str = "") -> None:
        self.delays.append((label, delay))
        self._seq += 1
        self._queue.append((self.now + delay, self._seq, job))

    async def advance(self, seconds: float) -> int:
        """Move time forward and run every job now due (including ones they schedule)."""
        self.now += seconds
        ran = 0
        while True:
            due = sorted(j for j in self._queue if j[0] <= self.now)
            if not due:
                return ran
            first = due[0]
            self._queue.remove(first)
            await first[2]()
            ran += 1

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def close(self) -> None:
        self._queue.clear()
