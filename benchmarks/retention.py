"""Retention in steady state: a bounded store and a flat sweep (issue 19).

A simulated clock runs DAYS days; each day PER_DAY lifecycles are recorded, sent and
delivered (one in 20 abandoned as a dead target), and a dead gateway leaves ORPHANS
obligations pending, which a new ledger sweeps (timed: the catch-up of the view over the
orphans and the claims) and then delivers; the views are caught up after the day's
writes, as a running gateway keeps them. Each day ends
with ``prune(older_than=7 days)`` into an archive. Printed per day: live obligations,
the store's bytes (file + WAL after a checkpoint) and bytes per live obligation, the
sweep's time, and the prune's. The baseline in the same run is day 8, the first day
after the retention window is full: the last day's sweep and bytes are reported as
ratios to it (flat and bounded: near 1.0).

Then the prune of BIG obligations at once (100,000 by default): the writer-hold time of
each batch (the prune's transaction), and the latency of a writer recording replies
meanwhile against that writer's latency without a prune (the baseline, same run).

    python benchmarks/retention.py [--days N] [--per-day N] [--big N] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway_ledger.application.delivery.retention import DEFAULT_BATCH
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import boot_id

RETENTION = timedelta(days=7)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def dead_owner(n: int) -> OwnerIdentity:
    return OwnerIdentity(
        host=socket.gethostname(), boot_id=boot_id(), pid=910_000_000 + n, start_time=1
    )


def lifecycles(ledger: DeliveryLedger, prefix: str, count: int, batch: int = 500) -> None:
    for start in range(0, count, batch):
        aggregates = []
        for i in range(start, min(start + batch, count)):
            agg = ledger.new_obligation(
                obligation_id=f"{prefix}{i:07d}",
                session_key=f"agent:main:telegram:dm:{i % 1000}",
                platform="telegram",
                chat_id=str(i % 1000),
                content=f"reply number {i}",
            )
            agg.start_attempt(by=ledger.owner, now=ledger.clock())
            if i % 20 == 19:
                agg.fail(
                    by=ledger.owner,
                    now=ledger.clock(),
                    error="blocked",
                    classification="dead_target",
                )
                agg.abandon(reason="dead_target", now=ledger.clock(), detail="blocked")
            else:
                agg.confirm_delivery(by=ledger.owner, now=ledger.clock(), receipt=[str(i)])
            aggregates.append(agg)
        ledger.save(*aggregates)


def orphans(location: str, clock: Clock, day: int, count: int) -> None:
    ledger = DeliveryLedger.open(location, owner=dead_owner(day), clock=clock)
    aggregates = [
        ledger.new_obligation(
            obligation_id=f"orphan-{day:03d}-{i:04d}",
            session_key=f"agent:main:telegram:dm:{i}",
            platform="telegram",
            chat_id=str(i),
            content=f"unsent reply {i}",
        )
        for i in range(count)
    ]
    ledger.save(*aggregates)
    ledger.close()


def store_bytes(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    return sum(Path(f"{db}{s}").stat().st_size for s in ("", "-wal") if Path(f"{db}{s}").exists())


def steady_state(
    tmp: Path, days: int, per_day: int, orphan_count: int, tombstone_days: int = 0
) -> list[dict[str, float]]:
    db = tmp / "steady.db"
    archive = tmp / "steady.archive.jsonl.gz"
    clock = Clock()
    rows = []
    for day in range(days):
        clock.now = T0 + timedelta(days=day, hours=12)
        ledger = DeliveryLedger.open(db, owner=dead_owner(1000 + day), clock=clock)
        lifecycles(ledger, f"d{day:03d}-", per_day)
        ledger.recoverable.catch_up()  # as a running gateway's views are (untimed)
        ledger.obligation_index.catch_up()
        ledger.close()
        orphans(str(db), clock, day, orphan_count)
        sweeper = DeliveryLedger.open(db, owner=dead_owner(2000 + day), clock=clock)
        started = time.perf_counter()
        won = sweeper.sweep_recoverable(clock.now)
        sweep_s = time.perf_counter() - started
        for item in won:
            sweeper.mark_delivered(item["obligation_id"], receipt=["late"])
        clock.now += timedelta(hours=11)
        report = sweeper.prune(
            RETENTION,
            archive=archive,
            forget_tombstones_older_than=timedelta(days=tombstone_days) if tombstone_days else None,
        )
        live = sweeper.obligation_index.count()
        sweeper.close()
        size = store_bytes(db)
        rows.append(
            {
                "day": day + 1,
                "live": live,
                "bytes": size,
                "bytes_per_live": size / max(live, 1),
                "sweep_ms": sweep_s * 1000,
                "claimed": len(won),
                "pruned": report.pruned,
                "prune_s": report.elapsed_seconds,
                "max_hold_ms": report.max_hold_seconds * 1000,
                "archive_bytes": archive.stat().st_size if archive.exists() else 0,
            }
        )
        r = rows[-1]
        print(
            f"day {r['day']:3d}: live {r['live']:8d}  store {r['bytes'] / 1e6:8.1f} MB  "
            f"{r['bytes_per_live']:7.0f} B/live  sweep {r['sweep_ms']:7.1f} ms "
            f"({r['claimed']} claimed)  pruned {r['pruned']:7d} in {r['prune_s']:6.2f} s "
            f"(max hold {r['max_hold_ms']:.1f} ms)",
            flush=True,
        )
    return rows


def writer_process(db: str, stop: Any, out: Any) -> None:
    """Another process recording replies one at a time, as a gateway does, timing each."""
    clock = Clock()
    clock.now = T0 + timedelta(days=30)
    ledger = DeliveryLedger.open(db, owner=dead_owner(5), clock=clock)
    latencies = []
    n = 0
    try:
        while not stop.is_set():
            started = time.perf_counter()
            ledger.record_obligation(
                obligation_id=f"live-{os.getpid()}-{n:08d}",
                session_key="agent:main:telegram:dm:7",
                platform="telegram",
                chat_id="7",
                content="meanwhile",
            )
            latencies.append(time.perf_counter() - started)
            n += 1
            time.sleep(0.002)
    finally:
        ledger.close()
        out.put(latencies)


def with_writer(db: Path, action: Callable[[], None]) -> list[float]:
    """The latencies of a writer process recording replies while ``action`` runs."""
    stop = multiprocessing.Event()
    out: Any = multiprocessing.Queue()
    process = multiprocessing.Process(target=writer_process, args=(str(db), stop, out))
    process.start()
    time.sleep(1.0)  # the writer is open and writing
    try:
        action()
    finally:
        stop.set()
    latencies: list[float] = out.get(timeout=60)
    process.join(timeout=60)
    return latencies


def big_prune(tmp: Path, big: int, batch: int) -> dict[str, float]:
    db = tmp / "big.db"
    clock = Clock()
    ledger = DeliveryLedger.open(db, owner=dead_owner(3), clock=clock)
    lifecycles(ledger, "big-", big, batch=1000)
    ledger.obligation_index.catch_up()
    ledger.recoverable.catch_up()
    ledger.close()
    clock.now = T0 + timedelta(days=30)
    baseline = with_writer(db, lambda: time.sleep(5.0))
    pruner = DeliveryLedger.open(db, owner=dead_owner(4), clock=clock)
    reports = []
    during = with_writer(
        db,
        lambda: reports.append(pruner.prune(RETENTION, archive=tmp / "big.gz", batch_size=batch)),
    )
    pruner.close()
    report = reports[0]
    return {
        "pruned": report.pruned,
        "batches": report.batches,
        "prune_s": report.elapsed_seconds,
        "max_hold_ms": report.max_hold_seconds * 1000,
        "mean_hold_ms": report.total_hold_seconds / max(report.batches, 1) * 1000,
        "writer_p50_base_ms": statistics.median(baseline) * 1000,
        "writer_max_base_ms": max(baseline) * 1000,
        "writer_p50_ms": statistics.median(during) * 1000,
        "writer_p99_ms": sorted(during)[int(len(during) * 0.99)] * 1000,
        "writer_max_ms": max(during) * 1000,
        "writes_during": len(during),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=28)
    parser.add_argument("--per-day", type=int, default=5000)
    parser.add_argument("--orphans", type=int, default=50)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="prune batch size")
    parser.add_argument(
        "--tombstone-days",
        type=int,
        default=0,
        help="forget tombstones pruned longer ago than this (0: keep them)",
    )
    parser.add_argument("--skip-big", action="store_true", help="only the steady state")
    parser.add_argument("--quick", action="store_true", help="10 days of 500, big 5,000")
    args = parser.parse_args()
    if args.quick:
        args.days, args.per_day, args.big = 10, 500, 5000
    with tempfile.TemporaryDirectory() as tmp:
        total = args.days * args.per_day
        print(
            f"steady state: {args.days} days x {args.per_day} lifecycles = {total:,}, "
            f"retention {RETENTION.days} days, pruned daily, tombstones kept "
            + (f"{args.tombstone_days} days" if args.tombstone_days else "forever")
        )
        rows = steady_state(Path(tmp), args.days, args.per_day, args.orphans, args.tombstone_days)
        base = rows[min(7, len(rows) - 1)]
        last = rows[-1]
        print(
            f"last day / day {base['day']}: store bytes {last['bytes'] / base['bytes']:.2f}x, "
            f"bytes per live obligation {last['bytes_per_live'] / base['bytes_per_live']:.2f}x, "
            f"sweep {last['sweep_ms'] / base['sweep_ms']:.2f}x "
            f"({last['bytes_per_live']:.0f} B per live obligation at the end)"
        )
        sweeps = [r["sweep_ms"] for r in rows[7:]] or [r["sweep_ms"] for r in rows]
        print(
            f"sweep per day after the window filled: median {statistics.median(sweeps):.1f} ms,"
            f" max {max(sweeps):.1f} ms; prune per day median "
            f"{statistics.median(r['prune_s'] for r in rows[7:] or rows):.2f} s"
        )
        if args.skip_big:
            return
        b = big_prune(Path(tmp), args.big, args.batch)
        print(
            f"prune of {b['pruned']:,} obligations: {b['batches']} batches of {args.batch} in "
            f"{b['prune_s']:.1f} s;"
            f" writers held {b['mean_hold_ms']:.1f} ms per batch on average, "
            f"{b['max_hold_ms']:.1f} ms at most"
        )
        print(
            f"a writer meanwhile: p50 {b['writer_p50_ms']:.2f} ms "
            f"({b['writer_p50_ms'] / b['writer_p50_base_ms']:.2f}x its baseline "
            f"{b['writer_p50_base_ms']:.2f} ms), p99 {b['writer_p99_ms']:.1f} ms, "
            f"max {b['writer_max_ms']:.1f} ms (baseline max {b['writer_max_base_ms']:.1f} ms), "
            f"{b['writes_during']} writes"
        )


if __name__ == "__main__":
    main()
