"""What benchmark (a) depends on, measured where it runs: the costs no Python can remove.

Target (a) of ``delivery.py`` (one conversation at a time, ours >= 1x the mutable-row
baseline) compares two fixed costs per reply (ADR 0046):

- the baseline: three commits, each an fsync, on the event loop;
- ours: one commit (a reply's ``Recorded + Attempting`` and the previous reply's
  ``Delivered``) on the writer thread, so one round trip loop -> writer -> loop, plus the
  Python that builds and seals the events (measured in place by ``delivery.py``).

This prints, each measured the same way in one run, the median of:

- the bare thread round trip: a ``SimpleQueue.put`` that wakes a thread, which answers
  with ``call_soon_threadsafe`` (what the group-commit writer does, with no work);
- a raw sqlite3 commit of our shape (three event rows into the library's table) and of
  the baseline's shape (INSERT, then two UPDATEs, one transaction each), WAL,
  ``synchronous=FULL``, rows of the sizes the delivery benchmark stores.

and the Python per reply that ours could spend and still break even in (a).

It also splits the CPU of a reply at (b) (64 concurrent conversations, encryption on,
SQLite) in two, each in reference units (``reference.py``) and timed in turns in one run:

- **the three events' own work**: the domain's three commands (``record``,
  ``start_attempt``, ``confirm_delivery``), the mapper sealing and encoding the three
  events, and their insert, saved through the ledger's event store in groups of the size
  (b) commits (one commit per 32 replies), on one thread: what any gateway path that
  records these three explicit events pays;
- **the gateway path** (``delivery.py``'s side "ours" at (b)): the same replies through
  ``Gateway.deliver``, with its hand-offs, futures, flight, pacing and tracing.

The difference is what the path around the events costs (issue 21: which half of a
reply's CPU could still be removed without recording less).

Last, the same three events' own work on one thread, in turns, grouped as (a) commits
them (one reply per commit) and as (b) does (32), split into building them (the domain's
commands, no I/O) and storing them (sealing, encoding, the insert and the commit): what
waiting for a commit per reply costs the Python around it, which no code on the path
removes (docs/performance.md, *Round 9*).

    python benchmarks/floor.py [--replies N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import CONCURRENCY, Ours, work
from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger import DeliveryLedger, compute_obligation_id

# Sizes of the stored state of a reply's events in the delivery benchmark (sealed).
RECORDED, ATTEMPTING, DELIVERED = 1170, 280, 440


async def round_trip(n: int) -> float:
    """Median seconds for the loop to wake a thread and be woken back by it."""
    jobs: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None]
    jobs = queue.SimpleQueue()

    def answer() -> None:
        while (job := jobs.get()) is not None:
            loop, waiter = job
            loop.call_soon_threadsafe(waiter.set_result, None)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        waiter = loop.create_future()
        jobs.put((loop, waiter))
        await waiter
        times.append(time.perf_counter() - started)
    jobs.put(None)
    thread.join()
    return statistics.median(times[n // 10 :])


def connect(path: Path, ddl: str) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(ddl)
    return conn


def commits(tmp: Path, n: int) -> tuple[float, float]:
    """Median seconds per reply: ours (one commit of three events), the baseline's three."""
    ours = connect(
        tmp / "events.db",
        "CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER,"
        " topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))",
    )
    base = connect(
        tmp / "rows.db",
        "CREATE TABLE delivery_obligations (obligation_id TEXT PRIMARY KEY, content TEXT,"
        " state TEXT, updated_at REAL)",
    )
    previous: str | None = None

    def our_reply() -> None:
        nonlocal previous
        oid = uuid.uuid4().hex
        rows = [
            (oid, 1, "Recorded", os.urandom(RECORDED)),
            (oid, 2, "Attempting", os.urandom(ATTEMPTING)),
        ]
        if previous is not None:
            rows.append((previous, 3, "Delivered", os.urandom(DELIVERED)))
        ours.execute("BEGIN IMMEDIATE")
        ours.executemany("INSERT INTO stored_events VALUES (?, ?, ?, ?)", rows)
        ours.execute("COMMIT")
        previous = oid

    mark = "UPDATE delivery_obligations SET state = ? WHERE obligation_id = ?"

    def base_reply() -> None:
        oid = uuid.uuid4().hex[:24]
        for sql, args in (
            ("INSERT INTO delivery_obligations VALUES (?, ?, 'pending', 0)", (oid, "x" * 230)),
            (mark, ("attempting", oid)),
            (mark, ("delivered", oid)),
        ):
            base.execute("BEGIN IMMEDIATE")
            base.execute(sql, args)
            base.execute("COMMIT")

    per_turn = 100
    times: dict[str, list[float]] = {"ours": [], "base": []}
    for _ in range(max(1, n // per_turn)):  # side by side, in turns (ADR 0018)
        for name, reply in (("ours", our_reply), ("base", base_reply)):
            started = time.perf_counter()
            for _ in range(per_turn):
                reply()
            times[name].append((time.perf_counter() - started) / per_turn)
    ours.close()
    base.close()
    return statistics.median(times["ours"]), statistics.median(times["base"])


GROUP = 32
"""Replies per commit at (b): ``delivery.py`` measures about 0.03 commits per lifecycle."""


def own_work(
    ledger: DeliveryLedger, first: int, count: int, group: int = GROUP
) -> tuple[float, float]:
    """``count`` replies' three events, built, sealed, encoded and stored in groups of
    ``group``; returns this thread's CPU seconds spent building them and storing them."""
    owner, clock = ledger.owner, ledger.clock
    build = store = 0.0
    for start in range(first, first + count, group):
        started = time.thread_time()
        aggregates = []
        for n in range(start, min(start + group, first + count)):
            key, chat, content = work(n, n % CONCURRENCY)
            agg = ledger.new_obligation(
                obligation_id=compute_obligation_id(key, f"in-{n}", content),
                session_key=key,
                platform="telegram",
                chat_id=chat,
                content=content,
                reply_to=f"in-{n}",
            )
            agg.start_attempt(by=owner, now=clock())
            agg.confirm_delivery(by=owner, now=clock(), receipt=[str(n)])
            aggregates.append(agg)
        built = time.thread_time()
        ledger.store_changes(aggregates)
        build += built - started
        store += time.thread_time() - built
    return build, store


def per_commit(tmp: Path, replies: int, turns: int) -> tuple[dict[str, float], float]:
    """Reference units per reply of the events' own work, built and stored, one reply
    per commit (``a``) and ``GROUP`` per commit (``b``), the groupings in turns, each
    turn followed by a unit sample; and the unit in seconds."""
    meter = CpuMeter()
    ledger = DeliveryLedger.open(tmp / "per-commit.db", encrypt=True)
    first = 0
    try:
        own_work(ledger, first, replies, 1)  # warm-up
        first += replies
        for _ in range(turns):
            for tag, group in (("a", 1), ("b", GROUP)):
                build, store = own_work(ledger, first, replies, group)
                first += replies
                meter.add(f"{tag} build", build)
                meter.add(f"{tag} store", store)
            meter.sample()
    finally:
        ledger.close()
    meter.close()
    done = replies * turns
    return {side: meter.units(side, done) for side in meter.seconds}, meter.unit


async def split_b(tmp: Path, replies: int, turns: int) -> tuple[float, float, float]:
    """Reference units per reply at (b): the events' own work, the gateway path, and the
    unit in seconds; the two sides in turns, each turn followed by a unit sample."""
    meter = CpuMeter()
    ledger = DeliveryLedger.open(tmp / "own.db", encrypt=True)
    ours = await Ours.open(tmp / "ours.db", encrypt=True)
    per_conv = max(1, replies // CONCURRENCY)
    count = per_conv * CONCURRENCY
    try:
        own_work(ledger, 0, count)  # warm-up, both sides
        await ours.segment(0, per_conv, CONCURRENCY)
        await ours.settle()
        for turn in range(1, turns + 1):
            started = cpu_seconds()
            own_work(ledger, turn * count, count)
            meter.add("own", cpu_seconds() - started)
            started = cpu_seconds()
            await ours.segment(turn * per_conv, per_conv, CONCURRENCY)
            await ours.settle()
            meter.add("path", cpu_seconds() - started)
            meter.sample()
    finally:
        await ours.close()
        ledger.close()
    meter.close()
    done = count * turns
    return meter.units("own", done), meter.units("path", done), meter.unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="600 replies (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.replies = 600
    trip = asyncio.run(round_trip(max(1000, args.replies * 3)))
    with tempfile.TemporaryDirectory(prefix="gateway-ledger-floor-") as tmp:
        ours, base = commits(Path(tmp), args.replies)
    us = 1e6
    budget = base - ours - trip
    print(f"machine: {machine()}")
    print(f"thread round trip (loop -> writer -> loop, no work): {trip * us:.0f} µs")
    print(f"raw commits per reply: ours (1 commit, 3 events) {ours * us:.0f} µs,")
    print(f"                       baseline (3 commits)      {base * us:.0f} µs")
    print(
        f"(a) breaks even if ours spends at most {budget * us:.0f} µs of Python per reply"
        " (building, sealing and handing over its events); delivery.py measures what it spends"
    )
    with tempfile.TemporaryDirectory(prefix="gateway-ledger-floor-") as tmp:
        own, path, unit = asyncio.run(split_b(Path(tmp), args.replies, 3 if args.quick else 5))
    print(
        f"(b), CPU per reply in reference units (u = {unit * us:.0f} µs): the three events'"
        f" own work {own:.2f} u; the gateway path {path:.2f} u; around the events"
        f" {path - own:.2f} u ({(path - own) / path:.0%} of the path)"
    )
    with tempfile.TemporaryDirectory(prefix="gateway-ledger-floor-") as tmp:
        split, unit = per_commit(Path(tmp), args.replies // 3, 3 if args.quick else 5)
    a = split["a build"] + split["a store"]
    b = split["b build"] + split["b store"]
    print(
        f"the events' own work per reply, one thread (u = {unit * us:.0f} µs):"
        f" a commit per reply (as (a)) {split['a build']:.2f} u to build +"
        f" {split['a store']:.2f} u to store = {a:.2f} u; {GROUP} replies per commit"
        f" (as (b)) {split['b build']:.2f} + {split['b store']:.2f} = {b:.2f} u;"
        f" building alone costs {split['a build'] / split['b build']:.1f}x"
        " when each reply waits for a commit"
    )


if __name__ == "__main__":
    main()
