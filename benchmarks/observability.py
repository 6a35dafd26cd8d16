"""What observability adds per event and per reply (issue 20): CPU, measured in one run.

- stamping an event with its cause and encoding it (the mapper, clear fields) inside an
  open turn, against the same event written with no turn open (nothing stamped);
- naming a reply's cause: the keyed digest of its inbound message id;
- the spans of one reply (deliver, record, send, settle: four ``tracing.span`` blocks)
  with no tracer provider set (the default: no SDK), against four empty ``with`` blocks.

    python benchmarks/observability.py [--n N]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gateway_ledger.application.observability import causes, tracing
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import DeliveryTarget, OwnerIdentity

OWNER = OwnerIdentity(host="bench", boot_id="b", pid=1, start_time=1)


def per_call_us(fn: Callable[[], None], n: int, rounds: int = 9) -> float:
    """CPU microseconds per call, the best of ``rounds`` (as ``timeit`` reports: the
    machine is shared, and other work only ever adds)."""
    times = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(n):
            fn()
        times.append((time.process_time() - started) / n * 1e6)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    from datetime import UTC, datetime

    with tempfile.TemporaryDirectory() as tmp:
        ledger = DeliveryLedger.open(Path(tmp) / "bench.db", encrypt=False)
        agg = DeliveryObligation.record(
            obligation_id="o" * 24,
            session_key="agent:main:telegram:dm:7",
            target=DeliveryTarget(platform="telegram", chat_id="7"),
            content="an answer of ordinary length " * 8,
            owner=OWNER,
            now=datetime(2026, 1, 1, tzinfo=UTC),
        )
        agg.start_attempt(by=OWNER, now=datetime(2026, 1, 1, tzinfo=UTC))
        events = agg.collect_events()
        to_stored = ledger.mapper.to_stored_event

        def plain() -> None:
            for e in events:
                e.__dict__.pop(causes.META, None)
            causes.stamp(events)
            for e in events:
                to_stored(e)

        def stamped() -> None:
            with causes.caused_by("inbound:" + "d" * 24, "c" * 32):
                plain()

        def caused_by_only() -> None:
            with causes.caused_by("inbound:" + "d" * 24, "c" * 32):
                pass

        base = per_call_us(plain, args.n)
        ours = per_call_us(stamped, args.n)
        turn = per_call_us(caused_by_only, args.n)
        for e in events:
            e.__dict__.pop(causes.META, None)
        size_plain = len(to_stored(events[0]).state)
        with causes.caused_by("inbound:" + "d" * 24, "c" * 32):
            for e in events:
                e.__dict__.pop(causes.META, None)
            causes.stamp(events)
            size_stamped = len(to_stored(events[0]).state)
        print(
            f"2 events stamped and encoded: {ours:.2f} µs vs {base:.2f} µs unstamped "
            f"(+{(ours - base) / 2:.2f} µs per event, of which opening the turn "
            f"{turn:.2f} µs once); stored size +{size_stamped - size_plain} bytes per event"
        )

        def spans() -> None:
            for name in ("deliver", "record", "send", "settle"):
                with tracing.span(name, obligation=agg, part=0):
                    pass

        def nothing() -> None:
            for _ in range(4):
                with contextlib.nullcontext():
                    pass

        keys = iter(range(10**9))

        def digest() -> None:
            causes.inbound(ledger, "agent:main:telegram:dm:7", f"in-{next(keys)}")

        print(
            f"the inbound cause (a keyed digest) of a reply: {per_call_us(digest, args.n):.2f} µs"
        )

        ours = per_call_us(spans, args.n)
        base = per_call_us(nothing, args.n)
        print(
            f"4 spans of a reply, no tracer provider: {ours:.2f} µs vs {base:.2f} µs "
            f"for 4 empty blocks (+{ours - base:.2f} µs per reply)"
        )
        ledger.close()


if __name__ == "__main__":
    main()
