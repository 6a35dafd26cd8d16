"""Group commit, ledger faults and the event loop: the store never stops or stalls a reply."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE, Reply, ReplyContext
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from tests.gateway_fakes import ScriptedAdapter

KEY = "agent:main:telegram:dm:"


def ctx(n: int) -> ReplyContext:
    return ReplyContext(session_key=f"{KEY}{n}", platform="telegram", chat_id=str(n))


def test_a_conflict_inside_a_group_loses_nothing_else(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    existing = ledger.new_obligation(
        obligation_id="o-dup", session_key=KEY, platform="telegram", chat_id="1", content="x"
    )
    ledger.save(existing)
    writer = GroupCommitWriter(ledger)
    fresh = [
        ledger.new_obligation(
            obligation_id=f"o-{i}", session_key=KEY, platform="telegram", chat_id="1", content="x"
        )
        for i in range(5)
    ]
    clash = ledger.new_obligation(
        obligation_id="o-dup", session_key=KEY, platform="telegram", chat_id="1", content="x"
    )
    with writer._cond:  # hold the writer so all six jobs form one group
        futures = [writer.submit(a.collect_events(), label=a.obligation_id) for a in fresh]
        futures.insert(2, writer.submit(clash.collect_events(), label="o-dup"))
    for i, f in enumerate(futures):
        if i == 2:
            assert isinstance(f.exception(timeout=10), ConcurrentUpdate)
        else:
            assert f.result(timeout=10) is None
    writer.close()
    assert writer.stats.largest_group == 6
    assert writer.stats.conflicts == 1
    assert all(ledger.exists(f"o-{i}") for i in range(5))


def test_concurrent_deliveries_share_commits(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location) as gw:
            await gw.start([adapter])
            outs = await asyncio.gather(
                *(gw.deliver(ctx(n), Reply(f"reply {n}"), f"in-{n}") for n in range(64)),
                gw.deliver(ctx(3), Reply("reply 3"), "in-3"),  # the same turn, concurrently
            )
            statuses = sorted(o.status for o in outs)
            assert statuses.count("delivered") == 64
            assert statuses.count("already_recorded") == 1
            stats = gw.stats()
            assert stats.commits < 2 * 64  # shared fsyncs
            assert stats.largest_group > 1
            await gw.flush()
            for n in range(64):
                oid = compute_obligation_id(f"{KEY}{n}", f"in-{n}", f"reply {n}")
                assert gw.ledger.get(oid).state == "delivered"
            assert len(adapter.sent) == 64

    asyncio.run(main())


class _Lock:
    """Another process's transaction holding the store's write lock."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.conn: Any = None

    def __enter__(self) -> _Lock:
        if location_is_sqlite(self.location):
            self.conn = sqlite3.connect(self.location, isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            params = parse_postgres_url(self.location)
            self.conn = connect(params)
            self.conn.execute("BEGIN")
            self.conn.execute(
                f'LOCK TABLE "{params["schema"]}".gateway_ledger_events IN ACCESS EXCLUSIVE MODE'
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def location_is_sqlite(location: str) -> bool:
    return not location.startswith("postgres")


def test_a_locked_store_does_not_stop_the_reply(store_location: str) -> None:
    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(store_location, ledger_deadline=0.3) as gw:
            await gw.start([adapter])
            await gw.deliver(ctx(0), Reply("warm up"), "in-0")  # tables exist
            with _Lock(store_location):
                started = time.monotonic()
                out = await gw.deliver(ctx(1), Reply("hello"), "in-1")
                waited = time.monotonic() - started
            assert out.status == "delivered" and adapter.sent[-1].content.endswith("hello")
            if location_is_sqlite(store_location):
                # Its record timed out; a read (WAL) found the turn recorded by nobody else.
                assert adapter.sent[-1].content == "hello"
            else:
                # Reads wait too: whether this turn was recorded (and sent) before cannot be
                # known, so it goes out, marked (ADR 0032); a ledger fault, not a block.
                assert adapter.sent[-1].content.startswith(DUPLICATE_NOTICE)
            assert waited < 2.0
            assert gw.stats().ledger_faults >= 1
            # The late commits land in order once the lock is gone: the history is whole.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if gw.ledger.exists(out.obligation_id) and (
                    gw.ledger.get(out.obligation_id).state == "delivered"
                ):
                    break
                await asyncio.sleep(0.05)
            await gw.flush()
            assert [h.type for h in gw.ledger.history(out.obligation_id)] == [
                "Recorded",
                "Attempting",
                "Delivered",
            ]

    asyncio.run(main())


def test_a_corrupt_store_does_not_stop_the_reply(tmp_path: Path, caplog: Any) -> None:
    db = tmp_path / "ledger.db"

    async def main() -> None:
        adapter = ScriptedAdapter()
        async with Gateway.open(db) as gw:
            await gw.start([adapter])
            await gw.deliver(ctx(0), Reply("warm up"), "in-0")
            gw.ledger.recorder.datastore.close()  # drop pooled connections, then wreck the file
            for path in tmp_path.iterdir():
                path.write_bytes(b"this is not a database" * 512)
            out = await gw.deliver(ctx(1), Reply("secret body"), "in-1")
            assert out.status == "delivered" and out.ledger_fault
            assert adapter.sent[-1].content == "secret body"
            assert gw.stats().ledger_faults >= 1

    asyncio.run(main())
    faults = [r.getMessage() for r in caplog.records if "ledger fault" in r.getMessage()]
    assert faults and all("secret body" not in m for m in faults)


SLOW_COMMIT = 0.15


class SlowDiskLedger(DeliveryLedger):
    """A real SQLite ledger on a disk whose every commit takes 150 ms."""

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_COMMIT)
        return super().save(*objs, **kwargs)


def slow_disk_gateway(ledger: DeliveryLedger) -> Gateway:
    """The gateway's writer appends through the ledger's event store: slow that down too."""

    def append(events: Any) -> None:
        time.sleep(SLOW_COMMIT)
        ledger.sealed_events.append(events)

    return Gateway(ledger, writer=GroupCommitWriter(ledger, append=append))


@pytest.mark.parametrize("conversations", [1, 64])
def test_a_slow_disk_never_stalls_the_event_loop(tmp_path: Path, conversations: int) -> None:
    async def probe(stop: asyncio.Event, lags: list[float]) -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.002)
            lags.append(time.perf_counter() - before - 0.002)

    async def main(attempt: int) -> list[float]:
        ledger = SlowDiskLedger.open(tmp_path / f"ledger-{attempt}.db")
        adapter = ScriptedAdapter()
        async with slow_disk_gateway(ledger) as gw:
            await gw.start([adapter])
            stop, lags = asyncio.Event(), []
            prober = asyncio.create_task(probe(stop, lags))
            for round_ in range(3):
                await asyncio.gather(
                    *(
                        gw.deliver(ctx(n), Reply(f"r{round_}-{n}"), f"in-{round_}")
                        for n in range(conversations)
                    )
                )
            stop.set()
            await prober
            assert gw.stats().delivered == 3 * conversations
        return lags

    # A store call on the loop would stall it for a whole slow commit (150 ms) in every
    # attempt. The machine is shared, so the OS may deschedule us now and then: the 20 ms
    # bound must hold in one of three attempts.
    worst: list[float] = []
    for attempt in range(3):
        lags = asyncio.run(main(attempt))
        assert len(lags) > 50
        worst.append(max(lags))
        if max(lags) < 0.020:
            break
    assert min(worst) < 0.020, f"event loop stalled {[round(w * 1000, 1) for w in worst]} ms"
