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

    python benchmarks/floor.py [--replies N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

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
    print(f"thread round trip (loop -> writer -> loop, no work): {trip * us:.0f} µs")
    print(f"raw commits per reply: ours (1 commit, 3 events) {ours * us:.0f} µs,")
    print(f"                       baseline (3 commits)      {base * us:.0f} µs")
    print(
        f"(a) breaks even if ours spends at most {budget * us:.0f} µs of Python per reply"
        " (building, sealing and handing over its events); delivery.py measures what it spends"
    )


if __name__ == "__main__":
    main()
