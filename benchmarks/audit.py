"""``audit duplicates`` on a store of a million events (target: within a minute).

The store is built fast by writing stored events in batches: a few obligation histories
are made once through the real aggregate and mapper (clean deliveries, an ambiguous
failure then a labelled re-send, a crash then a claim, and a planted unmarked re-send),
then copied under fresh aggregate ids. Reported, in one run: the audit, and as its
baseline a bare scan of the same notification log (pages read, nothing judged), so the
ratio shows what judging costs over reading.

    python benchmarks/audit.py [--quick] [--events N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from eventsourcing.persistence import StoredEvent

from gateway_ledger.application.delivery.audit import PAGE_SIZE, audit_duplicates
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
A = OwnerIdentity(host="bench", boot_id="b", pid=1, start_time=1)
B = OwnerIdentity(host="bench", boot_id="b", pid=2, start_time=1)
BATCH = 20_000
PLANT_EVERY = 10_000  # one unmarked re-send per this many obligations


def _history(kind: str) -> DeliveryObligation:
    t = iter(T0 + timedelta(seconds=s) for s in range(100))
    agg = DeliveryObligation.record(
        obligation_id="TEMPLATE-ID-000000000000",
        session_key="agent:main:telegram:dm:7",
        target=_target(),
        content="an answer of ordinary length " * 8,
        owner=A,
        now=next(t),
    )
    agg.start_attempt(by=A, now=next(t))
    if kind == "clean":
        agg.confirm_delivery(by=A, now=next(t), receipt=["1"])
    elif kind == "retried":
        agg.fail(by=A, now=next(t), error="timeout", classification="ambiguous")  # type: ignore[arg-type]
        agg.start_attempt(by=A, now=next(t))
        agg.confirm_delivery(by=A, now=next(t), receipt=["2"])
    elif kind == "claimed":
        agg.claim(by=B, now=next(t), policy=LedgerPolicy())
        agg.confirm_delivery(by=B, now=next(t), receipt=["3"])
    else:  # planted: ambiguous failure, then a claim that says no marker is needed
        agg.fail(by=A, now=next(t), error="timeout", classification="ambiguous")  # type: ignore[arg-type]
        agg._claimed(
            by=B,
            previous_owner=A,
            recovery_attempt=1,
            needs_marker=False,
            fence=1,
            timestamp=next(t),
        )
        agg.confirm_delivery(by=B, now=next(t), receipt=["4"])
    return agg


def _target() -> Any:
    from gateway_ledger.domain.values import DeliveryTarget

    return DeliveryTarget(platform="telegram", chat_id="7")


def copy_histories(
    ledger: DeliveryLedger, templates: dict[str, list[StoredEvent]], kind_of: Any, events: int
) -> int:
    """Write copies of the template histories under fresh ids, in batches, until ``events``
    are written (``kind_of(n)`` names the template of the n-th); returns how many."""
    written = n = 0
    batch: list[StoredEvent] = []
    while written < events:
        oid, name = uuid.uuid4(), f"{n:024x}".encode()
        template = templates[kind_of(n)]
        for s in template:
            state = s.state.replace(b"TEMPLATE-ID-000000000000", name)
            batch.append(StoredEvent(oid, s.originator_version, s.topic, state))
        written += len(template)
        n += 1
        if len(batch) >= BATCH:
            ledger.recorder.insert_events(batch)
            batch = []
    if batch:
        ledger.recorder.insert_events(batch)
    return n


def build(db: Path, events: int) -> tuple[DeliveryLedger, int]:
    ledger = DeliveryLedger.open(db, encrypt=False)
    templates = {}
    for kind in ("clean", "retried", "claimed", "planted"):
        templates[kind] = [
            ledger.mapper.to_stored_event(e) for e in _history(kind).collect_events()
        ]
    cycle = ["clean", "clean", "retried", "claimed"]

    def kind_of(n: int) -> str:
        return "planted" if n % PLANT_EVERY == PLANT_EVERY - 1 else cycle[n % len(cycle)]

    made = copy_histories(ledger, templates, kind_of, events)
    planted = sum(1 for n in range(made) if kind_of(n) == "planted")
    return ledger, planted


def bare_scan(ledger: DeliveryLedger) -> int:
    start, seen = 0, 0
    while True:
        page = ledger.recorder.select_notifications(start, PAGE_SIZE, inclusive_of_start=False)
        seen += len(page)
        if len(page) < PAGE_SIZE:
            return seen
        start = page[-1].id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events instead")
    parser.add_argument("--events", type=int, default=None)
    args = parser.parse_args()
    events = args.events or (100_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        ledger, planted = build(Path(tmp) / "audit.db", events)
        built = time.perf_counter() - started
        started = time.perf_counter()
        scanned = bare_scan(ledger)
        scan_s = time.perf_counter() - started
        report = audit_duplicates(ledger)
        found = report.counts()["unmarked_resend"]
        print(f"store: {scanned:,} events written in {built:.1f} s (SQLite, batches of {BATCH:,})")
        print()
        print("| measure | seconds | events/s | vs bare scan |")
        print("|---|---:|---:|---:|")
        print(
            f"| bare scan of the log (baseline) | {scan_s:.2f} | {scanned / scan_s:,.0f} | 1.00x |"
        )
        audit_s = report.elapsed_seconds
        print(
            f"| audit duplicates | {audit_s:.2f} | {report.events_scanned / audit_s:,.0f} "
            f"| {audit_s / scan_s:.2f}x |"
        )
        print()
        print(
            f"obligations {report.obligations:,}; planted unmarked re-sends {planted}, "
            f"found {found}; labelled possible duplicates {report.labelled_duplicates:,}; "
            f"{'within' if audit_s < 60 else 'OVER'} the one-minute target"
        )
        ledger.close()


if __name__ == "__main__":
    main()
