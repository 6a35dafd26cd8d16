"""Wake an asyncio event loop from the writer thread: one eventfd the loop watches.

A lone conversation is woken by the writer once per reply, on the critical path of the
reply (ADR 0020). ``call_soon_threadsafe`` allocates a handle with a copy of the context
for each wake-up, and the woken loop drains its self-pipe (two reads, the second one
raising) before it runs the handle. Here the writer queues the settled waiters on a deque
and writes the eventfd; the loop reads it once and settles what is queued: less work on
the reply's critical path (measured in docs/performance.md).

Linux only (``os.eventfd``), and only on loops with ``add_reader``;
:func:`waker_for` returns None elsewhere and the caller keeps ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable
from typing import Any

Settle = Callable[[list[asyncio.Future[None]], BaseException | None], None]


class LoopWaker:
    """Runs ``settle(waiters, error)`` on one loop, for calls made on any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Settle) -> None:
        self.loop = loop
        self._settle = settle
        self._pending: deque[tuple[list[asyncio.Future[None]], BaseException | None]] = deque()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            loop.add_reader(self._fd, self._run)
        except BaseException:
            os.close(self._fd)
            raise

    def wake(self, waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
        """Any thread: settle these waiters on the loop. Order is kept."""
        self._pending.append((waiters, error))
        os.eventfd_write(self._fd, 1)

    def _run(self) -> None:
        try:  # noqa: SIM105 - not contextlib.suppress: three calls more, once per reply
            os.eventfd_read(self._fd)
        except BlockingIOError:  # several wakes, one read: already read
            pass
        pending = self._pending
        while pending:
            self._settle(*pending.popleft())

    def close(self) -> None:
        """Stop watching and release the eventfd. Call it once nobody wakes any more, on
        the loop's thread or after the loop is closed."""
        if not self.loop.is_closed():
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self._fd)
        os.close(self._fd)


def waker_for(loop: asyncio.AbstractEventLoop, settle: Settle) -> LoopWaker | None:
    """A waker for the running ``loop``, or None where it cannot have one."""
    if not hasattr(os, "eventfd"):
        return None
    try:
        return LoopWaker(loop, settle)
    except (NotImplementedError, OSError):  # no add_reader (e.g. a proactor loop)
        return None


def close_wakers(wakers: dict[asyncio.AbstractEventLoop, Any]) -> None:
    """Release every waker once its writer has stopped: at once where its loop is closed
    or is this thread's, else on its own loop's thread."""
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for loop, waker in wakers.items():
        if waker is None:
            continue
        if loop.is_closed() or loop is running:
            waker.close()
        else:
            try:
                loop.call_soon_threadsafe(waker.close)
            except RuntimeError:  # closed meanwhile
                waker.close()
    wakers.clear()
