"""Waited-for writes that come together are handed to the writer together (ADR 0072).

After an event-loop iteration that submitted several waited-for writes, the next
iteration's are held until it ends and queued at once: one group, one commit. After an
iteration with one write (a lone conversation) the next goes to the writer at once.
Real SQLite files, a real writer thread.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter, WriteHandle
from tests.writer_support import events


def landed_within(handle: WriteHandle, seconds: float) -> bool:
    """Block the loop (no iteration ends meanwhile) until the write landed, or not."""
    deadline = time.monotonic() + seconds
    while not handle.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    return handle.done()


def test_a_lone_write_goes_to_the_writer_at_once(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger)

    async def main() -> None:
        _, waiter = writer.submit_waiting(events(ledger, "o-1"))
        await waiter
        second, waiter = writer.submit_waiting(events(ledger, "o-2"))
        # The iteration before submitted one write: this one is not held.
        assert landed_within(second, 10.0)
        await waiter

    asyncio.run(main())
    writer.close()
    assert ledger.exists("o-1") and ledger.exists("o-2")


def test_after_several_writes_together_the_next_are_held_until_the_iteration_ends(
    tmp_path: Path,
) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger)

    async def main() -> None:
        together = [writer.submit_waiting(events(ledger, f"o-{n}")) for n in range(2)]
        await asyncio.gather(*(waiter for _, waiter in together))
        commits = writer.stats.commits
        batch = [writer.submit_waiting(events(ledger, f"o-batch-{n}")) for n in range(20)]
        assert not landed_within(batch[0][0], 0.3)  # held: this iteration has not ended
        assert writer.stats.commits == commits
        await asyncio.gather(*(waiter for _, waiter in batch))
        # All twenty queued at once when the iteration ended: one group, one commit.
        assert writer.stats.commits == commits + 1
        assert writer.stats.largest_group >= 20

    asyncio.run(main())
    writer.close()
    assert all(ledger.exists(f"o-batch-{n}") for n in range(20))


def test_flush_and_close_queue_the_held_writes_first(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60)

    async def main() -> None:
        together = [writer.submit_waiting(events(ledger, f"o-{n}")) for n in range(2)]
        await asyncio.gather(*(waiter for _, waiter in together))
        held, _ = writer.submit_waiting(events(ledger, "o-held"))
        behind = writer.submit_behind(events(ledger, "o-behind"))
        await writer.flush()  # answered after both: the held write was queued before it
        assert held.done() and held.exception() is None
        assert behind.done() and behind.exception() is None
        writer.submit_waiting(events(ledger, "o-held-at-close"))
        writer.close()  # in the same iteration: the held write is queued, not refused

    asyncio.run(main())
    assert ledger.exists("o-held") and ledger.exists("o-held-at-close")
    ids = [n.originator_id for n in ledger.recorder.select_notifications(1, 10)]
    names = ["o-0", "o-1", "o-held", "o-behind", "o-held-at-close"]
    assert ids == [ledger.aggregate_id(name) for name in names]  # submission order


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(iterations=st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8))
def test_every_write_lands_once_in_submission_order(tmp_path: Path, iterations: list[int]) -> None:
    """Whatever the mix of lone and grouped iterations, held or not: each write lands,
    once, and the store's order is the order the loop submitted them in."""
    ledger = DeliveryLedger.open(tmp_path / f"l-{time.monotonic_ns()}.db")
    writer = GroupCommitWriter(ledger)
    submitted: list[str] = []

    async def main() -> None:
        waiters = []
        for i, count in enumerate(iterations):
            for n in range(count):
                name = f"o-{i}-{n}"
                submitted.append(name)
                waiters.append(writer.submit_waiting(events(ledger, name))[1])
            await asyncio.sleep(0)  # the iteration ends
        await asyncio.gather(*waiters)

    asyncio.run(main())
    writer.close()
    ids = [n.originator_id for n in ledger.recorder.select_notifications(1, 1000)]
    assert ids == [ledger.aggregate_id(name) for name in submitted]
    ledger.close()


class CountingLoop(asyncio.SelectorEventLoop):
    """A real event loop that counts the callbacks it is asked to schedule."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        self.scheduled += 1
        return super().call_soon(callback, *args, context=context)


def test_a_lone_write_asks_the_loop_for_nothing_more(tmp_path: Path) -> None:
    """One conversation at a time: handing a write over schedules no callback on the
    loop (no iteration of its own to end), reply after reply. A second write in the
    same iteration asks for the iteration's end once, and the next iteration holds."""
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger)
    loop = CountingLoop()

    async def main() -> None:
        for n in range(20):
            before = loop.scheduled
            _, waiter = writer.submit_waiting(events(ledger, f"o-{n}"))
            assert loop.scheduled == before  # nothing scheduled by the hand-over
            await waiter
        before = loop.scheduled
        together = [writer.submit_waiting(events(ledger, f"o-pair-{n}")) for n in range(2)]
        assert loop.scheduled == before + 1  # the second write asks for the iteration's end
        await asyncio.gather(*(waiter for _, waiter in together))
        held, waiter = writer.submit_waiting(events(ledger, "o-after-pair"))
        assert not landed_within(held, 0.3)  # the iteration after several holds its write
        await waiter

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    writer.close()
    assert all(ledger.exists(f"o-{n}") for n in range(20)) and ledger.exists("o-after-pair")
