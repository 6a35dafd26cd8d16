"""Group commit: one writer thread saves the events of many deliveries in one transaction.

The event loop never touches the store. Coroutines hand their pending events to the
writer and await a future; the writer takes what is queued since its last commit, up to
``max_group`` waited-for writes, appends it in one transaction (one fsync), through the
application's one write path (its event store's ``append``,
``infrastructure/eventstore/library.py``, the same as every other write), and resolves
every future. There is no timer: while one commit runs, the next group queues up, so a
single conversation pays no added latency and 64 conversations share their fsyncs.

Why a group stops at ``max_group``: when every conversation waits on the same commit,
the loop has nothing to do while it runs, and the writer nothing while the loop works
through the replies it released. On SQLite a group's write is one statement that runs
without the interpreter lock (``keyed_recorder.py``), so the recorder asks for groups of
at most 32 waited-for writes: with 64 conversations the loop then works on one group's
replies while the next group commits, and the two threads overlap on a 2-core machine
instead of taking turns (ADRs 0074, 0077). A PostgreSQL write is three round trips, each
taking the interpreter lock back, so more groups would only cost more commits; it keeps
the writer's default, 512.

Unless the replies come together: when one pass of the event loop over its ready
callbacks (an *iteration*) submits several waited-for writes, the writer would wake at
the first and start a group while the loop, holding the interpreter lock, submits the
rest; they then wait for the next commit, and each reply pays for more commits (measured
in docs/performance.md, round 12). So after an iteration that submitted several, the
loop holds the next iteration's waited-for writes and hands them over together when it
ends (one ``call_soon``): one group, one commit. After an iteration with one write (a
lone conversation) the next goes to the writer at once, as before: no added latency.
Nor an added iteration: the end of an iteration is asked for (``call_soon``) only once
it has a second write, or holds one. A lone write's iteration is over when the loop
settles a write, which it does in a later iteration (a waker's callback runs after the
iteration that submitted), or when the next write comes: two lone writes with no settle
between are counted as one iteration's several (ADR 0077).

The handoffs are kept thin because a lone conversation pays one round trip per reply:
jobs travel on a ``SimpleQueue`` (one wake-up of the writer, no condition-variable
ping-pong), and an asyncio caller gets an asyncio future that the writer settles once per
group and loop, through an eventfd that loop watches (``loop_waker.py``; elsewhere one
``call_soon_threadsafe``), instead of one ``wrap_future`` chain per job.

A write may also ride along (:meth:`GroupCommitWriter.submit_behind`): it does not wake
the writer, it joins the next group that something waited-for starts, or is committed
on its own after ``linger`` seconds at most. The delivery path writes a reply's
``Delivered`` that way (ADR 0016): the reply is already out, so nobody should wait for
that fact, and the next reply's ``Recorded + Attempting`` carries it to disk in the
same fsync. Jobs keep their submission order inside a group. A write behind that lands
costs the event loop nothing more: only a failure is reported back (``on_error``), and
:meth:`GroupCommitWriter.flush` is answered by the writer in queue order.

If the group's save fails on optimistic concurrency (``IntegrityError``), the writer does
not know which obligation conflicted, so it saves each job alone: the innocent ones land,
the conflicting one gets :class:`ConcurrentUpdate`. If it fails because a session was
erased meanwhile (``SessionErased``, ADR 0028), the jobs of the erased sessions get that
error and the others are committed again without them. Other errors (locked, full, corrupt
database) fail the whole group: the callers treat that as a ledger fault and send anyway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError

from gateway_ledger.application.observability.causes import stamp
from gateway_ledger.domain.errors import ConcurrentUpdate, LedgerError, SessionErased
from gateway_ledger.infrastructure.eventstore.library import SealedEventStore
from gateway_ledger.infrastructure.loop_waker import LoopWaker, close_wakers, waker_for

log = logging.getLogger("gateway_ledger.group_commit")

T = TypeVar("T")

DEFAULT_MAX_GROUP = 512
"""Waited-for writes per group at most (write-behind jobs ride along), unless the
application's recorder asks for fewer (its ``max_group``): see the module's docstring."""

DEFAULT_LINGER = 0.02
"""Seconds a write-behind job may wait for a group to join before it is committed alone."""

Append = Callable[[Sequence[Any]], object]
"""Stores events in one durable transaction (the application's ``events.append``)."""

_FLUSH = object()
"""Queued to make the writer commit the write-behind jobs now."""


@attrs.define
class _FlushRequest:
    """Queued by :meth:`GroupCommitWriter.flush`; answered once what was behind has landed."""

    waiter: asyncio.Future[None]


_order = itertools.count()


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


class WriteHandle:
    """How one queued write ended, for chaining (``after=``) and ``done()`` checks.

    Lighter than a ``concurrent.futures.Future`` (no condition variable): the writer
    thread settles it once, before it wakes the caller's asyncio waiter, and nobody
    blocks on it. :meth:`GroupCommitWriter.submit` still returns a real Future.
    """

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        return self._error

    def set_result(self, _: None) -> None:
        self._done = True

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done = True


Written = concurrent.futures.Future[None] | WriteHandle
"""A write's outcome: what ``after=`` accepts."""


@attrs.define
class _Job:
    label: str
    events: list[Any]
    future: Written
    after: Written | None = None
    waiter: asyncio.Future[None] | None = None
    """Settled on its own loop after ``future``; skipped if the caller stopped waiting."""
    on_error: tuple[asyncio.AbstractEventLoop, Callable[[BaseException], object]] | None = None
    """A write-behind job's failure report: called on that loop, and only on a failure."""
    seq: int = attrs.field(factory=_order.__next__)


@attrs.define
class _Iteration:
    """One event loop's waited-for writes, counted per iteration of that loop. ``open``
    and ``count`` belong to the loop's thread; ``held`` is shared (``_cond``)."""

    open: bool = False
    """The iteration's end is scheduled (``call_soon``): it has several writes, or holds."""
    hold: bool = False
    """This iteration's writes are held until it ends: the previous one submitted several."""
    count: int = 0
    """Waited-for writes of the iteration under way (one at most while not ``open``)."""
    held: list[_Job] = attrs.Factory(list)


class GroupCommitWriter:
    """A dedicated thread that owns every write of one application."""

    def __init__(
        self,
        app: Application[Any],
        *,
        max_group: int | None = None,
        name: str = "",
        append: Append | None = None,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self.app = app
        asked = getattr(app.recorder, "max_group", None)  # the store's own, if it has one
        self.max_group = max_group or (asked if isinstance(asked, int) else DEFAULT_MAX_GROUP)
        self.linger = linger
        self.stats = WriterStats()
        # ``append`` stores events in one durable transaction; raising the library's
        # IntegrityError on a version clash (a slower stand-in simulates a slow disk).
        events = app.events
        self._append: Append = append or (
            events.append if isinstance(events, SealedEventStore) else events.put
        )
        self._queue: queue.SimpleQueue[_Job | object | None] = queue.SimpleQueue()
        self._behind: list[_Job] = []  # write-behind jobs waiting for the next group
        self._iterations: dict[asyncio.AbstractEventLoop, _Iteration] = {}  # under _cond
        self._behind_unsettled = 0  # submitted behind and not settled yet (under _cond)
        self._linger_timer_on: asyncio.AbstractEventLoop | None = None  # loop of the timer
        # Per loop that waited on this writer: how the writer wakes it (None: no eventfd).
        self._wakers: dict[asyncio.AbstractEventLoop, LoopWaker | None] = {}
        # Held while a group is taken from the queue (and while submit checks ``_closed``):
        # whoever holds it keeps the writer from starting a group.
        self._cond = threading.RLock()
        self._closed = False
        self._started = False
        self._thread = threading.Thread(
            target=self._run, name=name or "gateway-ledger-writer", daemon=True
        )
        self._writer_ident: int | None = None  # the thread's, once it runs (``_settle``)
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
        after: Written | None = None,
    ) -> concurrent.futures.Future[None]:
        """Queue events for the next group; the future resolves once they are durable.

        ``after``: an earlier write of the same aggregate. If it failed, this one is
        refused instead of appending events on top of a history that is not there.
        """
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._enqueue(events, label, after, None, future)
        return future

    def submit_waiting(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Written | None = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> tuple[WriteHandle, asyncio.Future[None]]:
        """Like :meth:`submit`, but with an asyncio future on the running loop that settles
        the same way (await it; it is skipped if already done, e.g. timed out), and a
        :class:`WriteHandle` for chaining. ``on_error(error)`` is called on that loop if
        the write fails, whether or not the future was still awaited.

        ``loop``: the running loop, if the caller has it at hand (a reply's sender keeps
        its first write's). Else it is asked for, and Python 3.11 asks the kernel for
        the process id each time (``get_running_loop`` checks for a fork)."""
        if loop is None:
            loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if loop not in self._wakers:
            self._wakers[loop] = waker_for(loop, functools.partial(self._woken, loop))
        handle = WriteHandle()
        report = (loop, on_error) if on_error is not None else None
        self._enqueue(events, label, after, waiter, handle, report, loop)
        return handle, waiter

    def _held(self, loop: asyncio.AbstractEventLoop, job: _Job) -> bool:
        """Count a waited-for write in its loop's iteration; True if the iteration holds
        it until it ends (``_cond`` held). The iteration's end is asked for only when it
        decides something: a second write (the next iteration then holds), or a held one
        (handed over then). A lone write's iteration ends with the next settle
        (``_woken``)."""
        iteration = self._iterations.get(loop)
        if iteration is None:
            iteration = self._iterations[loop] = _Iteration()
        iteration.count += 1
        if not iteration.open and (iteration.hold or iteration.count > 1):
            iteration.open = True
            loop.call_soon(self._iteration_over, loop, iteration)
        if iteration.hold:
            iteration.held.append(job)
        return iteration.hold

    def _iteration_over(self, loop: asyncio.AbstractEventLoop, iteration: _Iteration) -> None:
        """On the loop, once the iteration that submitted has run: hand over what it held,
        and hold the next iteration's writes if this one submitted several."""
        with self._cond:
            iteration.open = False
            iteration.hold = iteration.count > 1
            iteration.count = 0
            self._hand_over(iteration)

    def _woken(
        self,
        loop: asyncio.AbstractEventLoop,
        waiters: list[asyncio.Future[None]],
        error: BaseException | None,
    ) -> None:
        """On the loop: settle the waiters, and end the count of a lone write's iteration.
        A settle runs in a later iteration than the writes counted so far, and a lone
        write decides nothing for the next (``open`` is False: at most one write, not
        held), so its count is dropped here instead of at an end asked for each time."""
        _wake(waiters, error)
        iteration = self._iterations.get(loop)
        if iteration is not None and not iteration.open:
            iteration.count = 0

    def _hand_over(self, iteration: _Iteration) -> None:
        """Queue an iteration's held writes, in order (``_cond`` held)."""
        held, iteration.held = iteration.held, []
        if held:
            self._queue_locked(held)

    def _queue_locked(self, jobs: list[_Job]) -> None:
        """Give jobs to the writer thread, in order; refuse them once it is closed
        (``_cond`` held)."""
        if self._closed:
            self._settle(jobs, LedgerUnavailable("the ledger writer is closed"))
            return
        self._start_locked()
        for job in jobs:
            self._queue.put(job)

    def submit_behind(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Written | None = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> WriteHandle:
        """Queue events without waking the writer: they join the next group, or are
        committed alone within ``linger`` seconds. Nothing wakes the caller when they
        land; if they do not, ``on_error(error)`` is called on the caller's loop.
        :meth:`flush` waits until they are settled either way. ``loop``: the running
        loop, as for :meth:`submit_waiting`."""
        if loop is None:
            loop = asyncio.get_running_loop()
        handle = WriteHandle()
        report = (loop, on_error) if on_error is not None else None
        stamp(events)  # on the caller's side: its turn and trace (ADR 0058)
        job = _Job(label, list(events), handle, after, None, report)
        with self._cond:
            if self._closed:
                self._settle([job], LedgerUnavailable("the ledger writer is closed"))
                return handle
            self._behind.append(job)
            self._behind_unsettled += 1
            arm = self._linger_timer_on is not loop  # none yet, or on a loop now gone
            self._linger_timer_on = loop
        if arm:
            loop.call_later(self.linger, self._linger_over)
        return handle

    def start(self) -> GroupCommitWriter:
        """Start the writer thread (idempotent). The first write starts it too: a
        constructed writer starts nothing (ADR 0036)."""
        with self._cond:
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        if not self._started and not self._closed:
            self._started = True
            self._thread.start()

    def _linger_over(self) -> None:
        with self._cond:
            self._linger_timer_on = None
            if self._behind and not self._closed:
                self._start_locked()
                self._queue.put(_FLUSH)

    async def flush(self) -> None:
        """Wait until every write-behind job submitted so far is settled (ok or not).

        The writer answers in queue order, after the group that carries those jobs: the
        jobs are either in that group or were settled by an earlier one. A closed writer
        settles them on its way out (``close`` waits for that)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            iteration = self._iterations.get(loop)
            if iteration is not None:  # queue order is submission order
                self._hand_over(iteration)
            if self._behind_unsettled == 0 or self._closed:
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._start_locked()
            self._queue.put(_FlushRequest(waiter))
        await waiter

    def _enqueue(
        self,
        events: Sequence[Any],
        label: str,
        after: Written | None,
        waiter: asyncio.Future[None] | None,
        future: Written,
        on_error: tuple[asyncio.AbstractEventLoop, Callable[[BaseException], object]] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Queue a job for the writer; ``loop``: a waited-for write's loop, whose iteration
        may hold it (see the module's docstring)."""
        stamp(events)  # on the caller's side: its turn and trace (ADR 0058)
        job = _Job(label, list(events), future, after, waiter, on_error)
        with self._cond:
            if loop is not None and not self._closed and self._held(loop, job):
                return
            self._queue_locked([job])

    async def write(self, events: Sequence[Any], *, label: str = "") -> None:
        await self.submit_waiting(events, label=label)[1]

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store read (or a sweep) off the event loop, after the write-behind jobs
        submitted so far have landed (so a read sees this process's own writes)."""
        await self.flush()
        return await self.read(fn, *args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store read off the event loop at once, NOT after the write-behind jobs:
        for a read that must not wait behind a stuck write, and may miss this process's
        own writes still queued (the ownership check before a send, ADR 0032)."""
        loop = asyncio.get_running_loop()
        # In the caller's context: what it writes there has the caller's turn and trace.
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._reader, context.run, fn, *args)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cond:
            if self._closed:
                return
            for iteration in self._iterations.values():  # held writes are queued first
                self._hand_over(iteration)
            if self._behind:
                self._start_locked()  # write-behind jobs still wait: the thread settles them
            self._closed = True
            started = self._started
            if started:
                self._queue.put(None)
        if not started:  # never written to: no thread to stop
            self._reader.shutdown(wait=True)
            close_wakers(self._wakers)
            return
        self._thread.join(timeout)
        self._reader.shutdown(wait=True)
        if self._thread.is_alive():
            return  # still writing: its wakers stay open
        close_wakers(self._wakers)

    # -- writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        self._writer_ident = threading.get_ident()
        pending = self._queue
        flushes: list[_FlushRequest] = []
        while True:
            item = pending.get()  # sleeps until there is work
            group: list[_Job] = []
            stop = False
            with self._cond:
                while True:
                    if item is None:
                        stop = True
                    elif isinstance(item, _Job):
                        group.append(item)
                    elif isinstance(item, _FlushRequest):
                        flushes.append(item)
                    if stop or len(group) >= self.max_group or pending.empty():
                        break
                    item = pending.get_nowait()
                behind = len(self._behind)
                if behind:
                    # Everything waiting behind rides along, even past ``max_group``: a
                    # later write of the same obligation may be in this group already.
                    group += self._behind
                    self._behind.clear()
                    group.sort(key=_submitted)
            if group:
                self._commit_group(group)
            if behind:
                with self._cond:
                    self._behind_unsettled -= behind
            if flushes:
                _answer(flushes)
                flushes.clear()
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
        except SessionErased as erased:
            self._refuse_erased(ready, erased)
            return
        except Exception as e:
            self._fail(ready, e)
            return
        self._settle(ready, None)

    def _admissible(self, job: _Job, queued_with: set[int]) -> bool:
        """A job whose earlier write (``after``) failed must not land on a missing history."""
        after = job.after
        if after is None or id(after) in queued_with:
            return True
        if after.done() and after.exception() is None:
            return True
        self._settle(
            [job], LedgerUnavailable(f"{job.label}: an earlier write of it was not recorded")
        )
        return False

    def _refuse_erased(self, jobs: list[_Job], erased: SessionErased) -> None:
        """Refuse the jobs of the erased sessions; commit the others again as a group."""
        subject_of = getattr(self.app.mapper, "subject_of", None)
        gone = set(erased.subject_ids)
        refused: list[_Job] = []
        rest: list[_Job] = []
        for job in jobs:
            subjects = {subject_of(e.originator_id) for e in job.events} if subject_of else gone
            (refused if subjects & gone else rest).append(job)
        if not refused:  # cannot tell whose it was: refuse them all rather than loop
            refused, rest = rest, []
        self._settle(refused, erased)
        if rest:
            self._commit_group(rest)

    def _commit_alone(self, job: _Job) -> None:
        try:
            self._save(job.events)
        except IntegrityError:
            self._conflict(job)
        except SessionErased as erased:
            self._settle([job], erased)
        except Exception as e:
            self._fail([job], e)
        else:
            self._settle([job], None)

    def _save(self, events: list[Any]) -> None:
        started = time.perf_counter()
        self._append(events)
        self.stats.commit_seconds += time.perf_counter() - started
        self.stats.commits += 1
        self.stats.events += len(events)

    def _conflict(self, job: _Job) -> None:
        self.stats.conflicts += 1
        self._settle([job], ConcurrentUpdate("DeliveryObligation", job.label, "write"))

    def _fail(self, jobs: list[_Job], error: Exception) -> None:
        self.stats.failures += len(jobs)
        log.warning("ledger write of %d job(s) failed: %s", len(jobs), type(error).__name__)
        self._settle(jobs, error)

    def _settle(self, jobs: list[_Job], error: BaseException | None) -> None:
        """Resolve the jobs' futures, then wake each waiting loop once for all its jobs.
        A write-behind job wakes nobody, unless it failed and has someone to tell."""
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for job in jobs:
            if error is None:
                job.future.set_result(None)
            else:
                job.future.set_exception(error)
                if job.on_error is not None:
                    loop, report = job.on_error
                    with contextlib.suppress(RuntimeError):  # that loop is gone
                        loop.call_soon_threadsafe(report, error)
            if job.waiter is not None:
                by_loop.setdefault(job.waiter.get_loop(), []).append(job.waiter)
        # Only the writer thread uses the wakers: they are closed once it has stopped.
        wakers = self._wakers if threading.get_ident() == self._writer_ident else {}
        for loop, waiters in by_loop.items():
            waker = wakers.get(loop)
            if waker is not None:
                waker.wake(waiters, error)
                continue
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(self._woken, loop, waiters, error)


def _submitted(job: _Job) -> int:
    return job.seq


def _answer(flushes: list[_FlushRequest]) -> None:
    for flush in flushes:
        with contextlib.suppress(RuntimeError):  # its loop is gone: nobody waits any more
            flush.waiter.get_loop().call_soon_threadsafe(_wake, [flush.waiter], None)


def _wake(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    """On the loop: settle the waiters that are still waited for."""
    for waiter in waiters:
        if waiter.done():
            continue
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
