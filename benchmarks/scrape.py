"""A Prometheus scrape of ``LedgerCollector`` on a store of a million events.

The store is built as ``benchmarks/audit.py`` builds it (obligation histories copied
under fresh ids: clean deliveries, a retried one, a claimed one); the views are caught
up once (as a follower or the first scrape would). Reported, in one run: a scrape of the
big store, a scrape of a store of 1,000 events as the baseline, the ratio, and what
replaying the history would cost instead (the view rebuild), which a scrape never does.

    python benchmarks/scrape.py [--quick] [--events N] [--scrapes K]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit import _history, copy_histories

from gateway_ledger import LedgerCollector
from gateway_ledger.bootstrap import DeliveryLedger


def build(db: Path, events: int) -> DeliveryLedger:
    """Obligation histories copied under fresh ids (as ``audit.py`` copies them)."""
    ledger = DeliveryLedger.open(db, encrypt=False)
    cycle = ["clean", "clean", "retried", "claimed"]
    templates = {
        kind: [ledger.mapper.to_stored_event(e) for e in _history(kind).collect_events()]
        for kind in set(cycle)
    }
    copy_histories(ledger, templates, lambda n: cycle[n % len(cycle)], events)
    return ledger


def scrape_ms(ledger: object, scrapes: int) -> tuple[float, int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(ledger))
    generate_latest(registry)  # catch-up and warm caches: the steady state is measured
    times = []
    size = 0
    for _ in range(scrapes):
        started = time.perf_counter()
        size = len(generate_latest(registry))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events instead")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--scrapes", type=int, default=15)
    args = parser.parse_args()
    events = args.events or (100_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        small = build(Path(tmp) / "small.db", 1_000)
        base_ms, _ = scrape_ms(small, args.scrapes)
        started = time.perf_counter()
        big = build(Path(tmp) / "big.db", events)
        built = time.perf_counter() - started
        started = time.perf_counter()
        big.obligation_index.catch_up()
        big.recoverable.catch_up()
        catch_up = time.perf_counter() - started
        big_ms, size = scrape_ms(big, args.scrapes)
        total = big.recorder.max_notification_id()
        print(f"store: {total:,} events (built in {built:.1f} s)")
        print(f"views caught up once (replaying every event): {catch_up:.1f} s")
        print(f"scrape, 1,000 events (baseline): {base_ms:.2f} ms (median of {args.scrapes})")
        print(f"scrape, {total:,} events: {big_ms:.2f} ms, {size:,} bytes")
        print(f"ratio: {big_ms / base_ms:.2f}x; replay instead: {catch_up * 1000 / big_ms:.0f}x")
        small.close()
        big.close()


if __name__ == "__main__":
    main()
