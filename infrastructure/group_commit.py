"""Group commit: one writer thread saves the events of many deliveries in one transaction.

The event loop never touches the store. Coroutines hand their pending events to the
writer and await a future; the writer takes everything queued since its last commit,
saves it with one ``app.save(*events)`` (one transaction, one fsync) and resolves every
future. There is no timer: while one commit runs, the next group queues up, so a single
conversation pays no added latency and 64 conversations share their fsyncs.

If the group's save fails on optimistic concurrency (``IntegrityError``), the writer does
not know which obligation conflicted, so it saves each job alone: the innocent ones land,
the conflicting one gets :class:`ConcurrentUpdate`. Other errors (locked, full, corrupt
database) fail the whole group: the callers treat that as a ledger fault and send anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError

from gateway_ledger.domain.errors import ConcurrentUpdate, LedgerError

log = logging.getLogger("gateway_ledger.group_commit")

T = TypeVar("T")


class LedgerUnavailable(LedgerError):
    """The store could not take a write (closed writer, earlier write of the same
    obligation failed, or the store itself raised)."""


@attrs.define
class WriterStats:
    commits: int = 0
    events: int = 0
    jobs: int = 0
    conflicts: int = 0
    failures: int = 0
    largest_group: int = 0
    commit_seconds: float = 0.0


@attrs.define
class _Job:
    label: str
    events: list[Any]
    future: concurrent.futures.Future[None]
    after: concurrent.futures.Future[None] | None = None


class GroupCommitWriter:
    """A dedicated thread that owns every write of one application."""

    def __init__(self, app: Application[Any], *, max_group: int = 512, name: str = "") -> None:
        self.app = app
        self.max_group = max_group
        self.stats = WriterStats()
        self._queue: deque[_Job | None] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=name or "gateway-ledger-writer", daemon=True
        )
        self._thread.start()
        # Reads and sweeps run on their own thread so they never sit in the commit queue.
        self._reader = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gateway-ledger-reader"
        )

    # -- caller side (any thread; the event loop only enqueues) -----------------------------

    def submit(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: concurrent.futures.Future[None] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Queue events for the next group; the future resolves once they are durable.

        ``after``: an earlier write of the same aggregate. If it failed, this one is
        refused instead of appending events on top of a history that is not there.
        """
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        job = _Job(label=label, events=list(events), future=future, after=after)
        with self._cond:
            if self._closed:
                future.set_exception(LedgerUnavailable("the ledger writer is closed"))
                return future
            self._queue.append(job)
            self._cond.notify()
        return future

    async def write(self, events: Sequence[Any], *, label: str = "") -> None:
        await asyncio.wrap_future(self.submit(events, label=label))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store read (or a sweep) off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, fn, *args)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._queue.append(None)
            self._cond.notify()
        self._thread.join(timeout)
        self._reader.shutdown(wait=True)

    # -- writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                group: list[_Job] = []
                stop = False
                while self._queue and len(group) < self.max_group:
                    job = self._queue.popleft()
                    if job is None:
                        stop = True
                        break
                    group.append(job)
            if group:
                self._commit_group(group)
            if stop:
                return

    def _commit_group(self, group: list[_Job]) -> None:
        queued = {id(job.future) for job in group}
        ready = [job for job in group if self._admissible(job, queued)]
        if not ready:
            return
        self.stats.jobs += len(ready)
        self.stats.largest_group = max(self.stats.largest_group, len(ready))
        try:
            self._save([e for job in ready for e in job.events])
        except IntegrityError:
            if len(ready) == 1:
                self._conflict(ready[0])
                return
            log.info("group of %d conflicted; saving each alone", len(ready))
            for job in ready:
                if self._admissible(job, set()):
                    self._commit_alone(job)
            return
        except Exception as e:
            self._fail(ready, e)
            return
        for job in ready:
            job.future.set_result(None)

    @staticmethod
    def _admissible(job: _Job, queued_with: set[int]) -> bool:
        """A job whose earlier write (``after``) failed must not land on a missing history."""
        after = job.after
        if after is None or id(after) in queued_with:
            return True
        if after.done() and after.exception() is None:
            return True
        job.future.set_exception(
            LedgerUnavailable(f"{job.label}: an earlier write of it was not recorded")
        )
        return False

    def _commit_alone(self, job: _Job) -> None:
        try:
            self._save(job.events)
        except IntegrityError:
            self._conflict(job)
        except Exception as e:
            self._fail([job], e)
        else:
            job.future.set_result(None)

    def _save(self, events: list[Any]) -> None:
        started = time.perf_counter()
        self.app.save(*events)
        self.stats.commit_seconds += time.perf_counter() - started
        self.stats.commits += 1
        self.stats.events += len(events)

    def _conflict(self, job: _Job) -> None:
        self.stats.conflicts += 1
        job.future.set_exception(ConcurrentUpdate("DeliveryObligation", job.label, "write"))

    def _fail(self, jobs: list[_Job], error: Exception) -> None:
        self.stats.failures += len(jobs)
        log.warning("ledger write of %d job(s) failed: %s", len(jobs), type(error).__name__)
        for job in jobs:
            job.future.set_exception(error)
