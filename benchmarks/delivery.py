"""Delivery lifecycles per second: gateway-ledger's delivery path vs an upstream-style ledger.

Baseline (written here, like upstream): one mutable SQLite row per obligation, INSERT then
two UPDATEs, one transaction each, called synchronously (upstream calls it on the event
loop). Ours: ``Gateway.deliver`` with a platform that answers at once: record+attempting
in one commit before the send, ``Delivered`` written behind it (ADR 0016), group-committed
across concurrent conversations on a writer thread. Both on SQLite in WAL mode with
``synchronous=FULL`` (SQLite's default), on the same disk, measured in one run.

Side by side: the three contenders (baseline, ours, ours with ``encrypt=False``) are
opened once, warmed up, and then take turns, one short segment each, many times over
(the order rotates every turn), each segment timed and summed per side. A shared, noisy
machine then slows all three alike instead of whichever happened to run during a burst.
Each of our segments ends with ``flush()``, so its written-behind results count in it.

Event-loop time per lifecycle: the wall time the loop spent outside its selector (running
callbacks, or blocked in a synchronous call), per lifecycle. That is the time the
gateway's other conversations could not run: the baseline commits on the loop, so all of
its commits count; ours only counts the Python that runs on the loop.

CPU per lifecycle: each segment's ``getrusage`` delta (user + system time of the whole
process, so the writer thread counts), summed per side; and the same divided by the
reference unit of ``reference.py`` timed in this run ("u"), the figure that travels
between machines. ``--postgres URL`` puts our two contenders on PostgreSQL (the baseline
stays upstream's SQLite file).

    python benchmarks/delivery.py [--quick] [--segments N] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.values import DeliveryTarget, MediaItem

CONCURRENCY = 64


class MutableRowLedger:
    """Upstream's shape: one row, updated in place, one transaction per call."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=10)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS delivery_obligations (obligation_id TEXT PRIMARY KEY,"
            " session_key TEXT, platform TEXT, chat_id TEXT, thread_id TEXT, content TEXT,"
            " state TEXT, attempts INTEGER DEFAULT 0, owner_pid INTEGER, owner_start INTEGER,"
            " last_error TEXT, created_at REAL, updated_at REAL)"
        )

    def synchronous(self) -> int:
        return int(self.conn.execute("PRAGMA synchronous").fetchone()[0])

    def _tx(self, sql: str, params: tuple[Any, ...]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(sql, params)
        self.conn.execute("COMMIT")

    def record(self, oid: str, key: str, chat: str, content: str) -> None:
        now = time.time()
        self._tx(
            "INSERT OR IGNORE INTO delivery_obligations (obligation_id, session_key, platform,"
            " chat_id, thread_id, content, state, owner_pid, owner_start, created_at,"
            " updated_at) VALUES (?, ?, 'telegram', ?, NULL, ?, 'pending', 1, 1, ?, ?)",
            (oid, key, chat, content, now, now),
        )

    def mark(self, oid: str, state: str) -> None:
        self._tx(
            "UPDATE delivery_obligations SET state = ?, updated_at = ? WHERE obligation_id = ?",
            (state, time.time(), oid),
        )


class InstantPlatform(AdapterBase):
    platform = "telegram"

    async def send(
        self,
        target: DeliveryTarget,
        content: str,
        *,
        reply_to: str | None,
        media: Sequence[MediaItem],
        metadata: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> SendResult:
        await asyncio.sleep(0)
        return SendResult.ok("1")


def work(n: int, conv: int) -> tuple[str, str, str]:
    """Session key, chat and reply text of reply ``n`` (each side computes the id once)."""
    key = f"agent:main:telegram:dm:{conv}"
    content = f"reply {n} to conversation {conv}: " + "x" * 200
    return key, str(conv), content


class LoopClock:
    """Wall time the running loop spends inside its selector, i.e. idle (asyncio's
    selector loops; the benchmark owns its loop, so it may wrap the private selector)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.idle = 0.0
        selector = loop._selector  # type: ignore[attr-defined]
        select = selector.select

        def timed_select(timeout: float | None = None) -> Any:
            started = time.perf_counter()
            try:
                return select(timeout)
            finally:
                self.idle += time.perf_counter() - started

        selector.select = timed_select


class Contender:
    """One side of the comparison, open for the whole run: ``segment`` is timed."""

    async def run(self, conv: int, first: int, count: int) -> None:
        raise NotImplementedError

    async def segment(
        self, first: int, count: int, concurrency: int, clock: LoopClock | None = None
    ) -> tuple[float, float, float]:
        """Seconds the segment took, seconds of it the event loop was busy, and the
        process's CPU seconds in it."""
        idle = clock.idle if clock is not None else 0.0
        cpu = cpu_seconds()
        started = time.perf_counter()
        await asyncio.gather(*(self.run(c, first, count) for c in range(concurrency)))
        await self.settle()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds() - cpu
        return elapsed, elapsed - ((clock.idle if clock is not None else 0.0) - idle), cpu

    async def settle(self) -> None:
        pass

    async def close(self) -> None:
        pass


class Baseline(Contender):
    def __init__(self, path: Path) -> None:
        self.ledger = MutableRowLedger(path)
        assert self.ledger.synchronous() == 2  # FULL

    async def run(self, conv: int, first: int, count: int) -> None:
        ledger = self.ledger
        for n in range(first, first + count):
            key, chat, content = work(n, conv)
            oid = compute_obligation_id(key, f"in-{n}", content)
            ledger.record(oid, key, chat, content)  # sync on the loop, as upstream does
            ledger.mark(oid, "attempting")
            await asyncio.sleep(0)  # the send
            ledger.mark(oid, "delivered")

    async def close(self) -> None:
        self.ledger.conn.close()


class Ours(Contender):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @classmethod
    async def open(cls, location: Path | str, *, encrypt: bool) -> Ours:
        gateway = Gateway(DeliveryLedger.open(location, encrypt=encrypt))
        if isinstance(location, Path):
            with gateway.ledger.recorder.datastore.transaction(commit=False) as c:
                c.execute("PRAGMA synchronous")
                assert c.fetchone()[0] == 2  # FULL, the library's (and SQLite's) default
            assert gateway.ledger.recorder.synchronous() == 2  # write connection: FULL too
        await gateway.start([InstantPlatform()])
        return cls(gateway)

    async def run(self, conv: int, first: int, count: int) -> None:
        deliver = self.gateway.deliver
        for n in range(first, first + count):
            key, chat, content = work(n, conv)
            out = await deliver(ReplyContext(key, "telegram", chat), Reply(content), f"in-{n}")
            assert out.status == "delivered", out

    async def settle(self) -> None:
        await self.gateway.flush()

    async def close(self) -> None:
        await self.gateway.close()


SIDES = ("base", "ours", "clear")


def our_location(tmp: Path, name: str, postgres: str | None) -> Path | str:
    if postgres is None:
        return tmp / f"{name}.db"
    sep = "&" if "?" in postgres else "?"
    return f"{postgres}{sep}schema=bench_delivery_{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"


def drop_schema(location: Path | str) -> None:
    if isinstance(location, Path):
        return
    from psycopg import sql

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    params = parse_postgres_url(location)
    with connect(params) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(params["schema"]))
        )


async def compare(
    tmp: Path, concurrency: int, per_segment: int, segments: int, postgres: str | None = None
) -> tuple[dict[str, list[float]], dict[str, float], float, CpuMeter]:
    """Seconds per segment for each side, each side's busy event-loop seconds, our
    commits per lifecycle, and each side's CPU seconds."""
    clock = LoopClock(asyncio.get_running_loop())
    tag = f"c{concurrency}"
    meter = CpuMeter()
    ours_at = our_location(tmp, f"ours-{tag}", postgres)
    clear_at = our_location(tmp, f"clear-{tag}", postgres)
    sides: dict[str, Contender] = {
        "base": Baseline(tmp / f"base-{tag}.db"),
        "ours": await Ours.open(ours_at, encrypt=True),
        "clear": await Ours.open(clear_at, encrypt=False),
    }
    count = per_segment // concurrency  # lifecycles per conversation and segment
    for side in sides.values():  # warm-up: tables, connections, data keys, caches
        await side.segment(0, count, concurrency)
    ours = sides["ours"]
    assert isinstance(ours, Ours)
    commits_before = ours.gateway.stats().commits
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    busy = dict.fromkeys(SIDES, 0.0)
    for turn in range(segments):
        first = (turn + 1) * count
        order = SIDES[turn % 3 :] + SIDES[: turn % 3]
        meter.sample()
        for name in order:
            elapsed, loop_busy, cpu = await sides[name].segment(first, count, concurrency, clock)
            times[name].append(elapsed)
            busy[name] += loop_busy
            meter.add(name, cpu)
    commits = ours.gateway.stats().commits - commits_before
    for side in sides.values():
        await side.close()
    for location in (ours_at, clear_at):
        drop_schema(location)
    meter.close()
    return times, busy, commits / (count * concurrency * segments), meter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer segments (CI smoke run)")
    parser.add_argument("--segments", type=int, default=0, help="turns per side (default 15)")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        default=None,
        help="our contenders on this PostgreSQL database (e.g."
        " postgresql://postgres@127.0.0.1:5432/test), each in a schema of its own, dropped"
        " after; the baseline stays the SQLite mutable-row ledger",
    )
    args = parser.parse_args()
    segments = args.segments or (3 if args.quick else 15)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ledger-bench-"))
    scenarios = (
        ("(a) one conversation at a time", 1, 200),
        (f"(b) {CONCURRENCY} concurrent conversations", CONCURRENCY, 640),
    )
    store = "PostgreSQL" if args.postgres else "SQLite WAL, synchronous=FULL"
    print(f"machine: {machine()}")
    print(
        "record -> attempting -> delivered lifecycles/s; baseline SQLite WAL,"
        f" synchronous=FULL; ours {store};"
        f" {segments} interleaved segments per side; gateway-ledger encrypts personal"
        " fields (ADR 0012), and runs with encrypt=False side by side"
    )
    print(
        "| scenario | mutable-row baseline | gateway-ledger | ratio | commits/lifecycle"
        " | encrypt=False | encryption cost | event-loop time per lifecycle"
        " | CPU per lifecycle: baseline, ours, encrypt=False |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios, costs, meters = [], [], []
    for label, concurrency, per_segment in scenarios:
        times, busy, cpl, meter = asyncio.run(
            compare(tmp, concurrency, per_segment, segments, args.postgres)
        )
        meters.append(meter)
        n = (per_segment // concurrency) * concurrency
        rate = {name: n * len(t) / sum(t) for name, t in times.items()}
        loop_us = {name: 1e6 * b / (n * len(times[name])) for name, b in busy.items()}
        ratio = rate["ours"] / rate["base"]
        cost = 1 - rate["ours"] / rate["clear"]
        # Spread: the middle half of the per-turn ratios (turns are short and noisy).
        turns = sorted(b / o for b, o in zip(times["base"], times["ours"], strict=True))
        costs_by_turn = sorted(
            1 - c / o for c, o in zip(times["clear"], times["ours"], strict=True)
        )
        q = len(turns) // 4
        lifecycles = n * segments
        ratios.append(ratio)
        costs.append(cost)
        print(
            f"| {label} | {rate['base']:,.0f}/s | {rate['ours']:,.0f}/s | {ratio:.2f}x"
            f" ({turns[q]:.2f}-{turns[-1 - q]:.2f}) | {cpl:.2f} | {rate['clear']:,.0f}/s"
            f" | {cost:+.1%} ({costs_by_turn[q]:+.1%} to {costs_by_turn[-1 - q]:+.1%})"
            f" | baseline {loop_us['base']:.0f} µs, ours {loop_us['ours']:.0f} µs"
            f" | {meter.cell('base', lifecycles)}; {meter.cell('ours', lifecycles)};"
            f" {meter.cell('clear', lifecycles)} |"
        )
    print(f"targets: (a) >= 1x -> {ratios[0]:.2f}x, (b) >= 3x -> {ratios[1]:.2f}x")
    print(f"encryption cost target <= 15%: (a) {costs[0]:+.1%}, (b) {costs[1]:+.1%}")
    print("u = reference units (reference.py): " + "; ".join(m.describe() for m in meters))


if __name__ == "__main__":
    main()
