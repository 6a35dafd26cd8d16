"""Write-behind jobs (ADR 0016): they wait for a group to join, or for the linger to end."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from tests.writer_support import events


def test_a_behind_job_waits_for_the_next_group_and_keeps_its_order(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60)

    async def main() -> None:
        behind = writer.submit_behind(events(ledger, "o-behind"))
        await asyncio.sleep(0.2)
        assert writer.stats.commits == 0 and not behind.done()  # nothing woke the writer
        await writer.write(events(ledger, "o-waited"))
        assert behind.done() and behind.exception() is None
        assert (writer.stats.commits, writer.stats.largest_group) == (1, 2)  # one fsync

    asyncio.run(main())
    writer.close()
    ids = [n.originator_id for n in ledger.recorder.select_notifications(1, 10)]
    # submission order
    assert ids == [ledger.aggregate_id("o-behind"), ledger.aggregate_id("o-waited")]


def test_flush_and_close_land_what_is_behind(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60)

    async def main() -> None:
        first = writer.submit_behind(events(ledger, "o-1"))
        await writer.flush()
        assert first.done() and ledger.exists("o-1")
        writer.submit_behind(events(ledger, "o-2"))

    asyncio.run(main())
    assert not ledger.exists("o-2")
    writer.close()  # finishes what is queued, behind jobs included
    assert ledger.exists("o-2")


def test_the_linger_ends_on_a_new_loop_after_the_old_one_is_gone(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=0.05)

    async def leave_one_behind() -> None:
        writer.submit_behind(events(ledger, "o-old"))  # its timer dies with this loop

    async def then_another() -> None:
        writer.submit_behind(events(ledger, "o-new"))
        for _ in range(100):
            if ledger.exists("o-new"):
                break
            await asyncio.sleep(0.05)

    asyncio.run(leave_one_behind())
    asyncio.run(then_another())
    assert ledger.exists("o-old") and ledger.exists("o-new")
    writer.close()


def test_every_behind_job_rides_even_past_max_group(tmp_path: Path) -> None:
    """A waited write chained after a behind one (same obligation) is never refused."""
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60, max_group=1)

    async def main() -> None:
        agg = ledger.new_obligation(
            obligation_id="o-x", session_key="agent:main:cli:dm:1", platform="cli",
            chat_id="1", content="hi",
        )  # fmt: skip
        await writer.write(agg.collect_events())
        for i in range(3):  # unrelated jobs waiting behind, submitted first
            writer.submit_behind(events(ledger, f"o-{i}"))
        agg.start_attempt(by=ledger.owner, now=ledger.clock())
        attempting = writer.submit_behind(agg.collect_events())
        agg.confirm_delivery(by=ledger.owner, now=ledger.clock(), receipt=["m-1"])
        _, delivered = writer.submit_waiting(agg.collect_events(), after=attempting)
        await delivered  # its earlier write rode in the same group: admitted

    asyncio.run(main())
    writer.close()
    assert [h.type for h in ledger.history("o-x")] == ["Recorded", "Attempting", "Delivered"]
    assert all(ledger.exists(f"o-{i}") for i in range(3))


def test_only_a_failed_behind_job_reports_back_and_flush_waits_for_it(tmp_path: Path) -> None:
    """A write behind that lands wakes nobody; one that fails calls ``on_error`` on the loop."""
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60)
    reports: list[tuple[str, BaseException]] = []

    async def main() -> None:
        loop_thread = threading.get_ident()

        def report(label: str) -> Callable[[BaseException], None]:
            def on_error(error: BaseException) -> None:
                assert threading.get_ident() == loop_thread  # called on the caller's loop
                reports.append((label, error))

            return on_error

        twice = events(ledger, "o-dup")
        writer.submit_behind(events(ledger, "o-ok"), on_error=report("o-ok"))
        writer.submit_behind(twice, on_error=report("o-dup first"))
        clash = writer.submit_behind(list(twice), on_error=report("o-dup again"))
        await writer.flush()
        assert clash.done() and isinstance(clash.exception(), ConcurrentUpdate)
        assert [label for label, _ in reports] == ["o-dup again"]
        assert isinstance(reports[0][1], ConcurrentUpdate)
        commits = writer.stats.commits
        await writer.flush()  # nothing behind: answered without a round trip to the writer
        assert writer.stats.commits == commits

    asyncio.run(main())
    writer.close()
    assert ledger.exists("o-ok") and ledger.exists("o-dup")


def test_writes_given_the_running_loop_settle_and_report_on_it(tmp_path: Path) -> None:
    """A sender that hands the writer its loop (a reply's later writes) is answered there,
    as one whose loop the writer asks for."""
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    writer = GroupCommitWriter(ledger, linger=60)
    reports: list[BaseException] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        twice = events(ledger, "o-given")
        handle, waiter = writer.submit_waiting(twice, loop=loop)
        assert waiter.get_loop() is loop
        await waiter
        assert handle.done() and handle.exception() is None
        clash = writer.submit_behind(list(twice), on_error=reports.append, loop=loop)
        await writer.flush()
        assert isinstance(clash.exception(), ConcurrentUpdate)
        assert len(reports) == 1 and isinstance(reports[0], ConcurrentUpdate)

    asyncio.run(main())
    writer.close()
    assert ledger.exists("o-given")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(["behind", "waited", "flush", "yield", "flush-later"]),
        min_size=1,
        max_size=25,
    )
)
def test_flush_returns_only_once_everything_behind_before_it_is_settled(
    tmp_path: Path, steps: list[str]
) -> None:
    """Any interleaving of writes behind, waited writes and flushes from several tasks: a
    flush returns only when every write behind submitted before it has been settled."""
    ledger = DeliveryLedger.open(tmp_path / f"l-{uuid.uuid4().hex}.db")
    writer = GroupCommitWriter(ledger, linger=60)
    handles = []

    async def flush_and_check() -> None:
        before = list(handles)
        await writer.flush()
        assert all(handle.done() for handle in before)

    async def main() -> None:
        tasks = []
        for i, step in enumerate(steps):
            if step == "behind":
                handles.append(writer.submit_behind(events(ledger, f"o-{i}")))
            elif step == "waited":
                tasks.append(asyncio.ensure_future(writer.write(events(ledger, f"o-{i}"))))
            elif step == "flush":
                await flush_and_check()
            elif step == "flush-later":
                tasks.append(asyncio.ensure_future(flush_and_check()))
            else:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        await flush_and_check()

    asyncio.run(main())
    writer.close()
    assert all(handle.done() and handle.exception() is None for handle in handles)
