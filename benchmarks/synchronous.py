"""The synchronous, upstream-compatible API vs an upstream-style mutable-row ledger.

One lifecycle at a time, as an existing gateway calls it: ``record_obligation`` ->
``mark_attempting`` -> ``mark_delivered``, each call one transaction, on the caller's
thread. Baseline: the mutable-row ledger of ``delivery.py`` (one SQLite row per
obligation, INSERT then two UPDATEs). Ours: ``DeliveryLedger`` through its public
methods, encrypting personal fields (the default), and with ``encrypt=False`` beside it.
Every side is SQLite in WAL mode with ``synchronous=FULL`` (checked), on the same disk.

The sides are opened once, warmed up, then take turns, one short segment each, many
times over (the order rotates every turn); a noisy machine then slows all of them
alike. Reported: lifecycles per second, the ratio ours/baseline measured in this run
(and the middle half of the per-turn ratios), and the CPU time per lifecycle
(``getrusage``: user + system of this process) of each side, also in reference units
("u", ``reference.py``, timed in the same run: the figure that travels between machines).

    python benchmarks/synchronous.py [--quick] [--segments N] [--per-segment N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import MutableRowLedger, work
from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import compute_obligation_id

Lifecycle = Callable[[int], None]


def baseline(path: Path) -> tuple[Lifecycle, Callable[[], None]]:
    ledger = MutableRowLedger(path)
    assert ledger.synchronous() == 2  # FULL

    def lifecycle(n: int) -> None:
        key, chat, content = work(n, n % 7)
        oid = compute_obligation_id(key, f"in-{n}", content)
        ledger.record(oid, key, chat, content)
        ledger.mark(oid, "attempting")
        ledger.mark(oid, "delivered")

    return lifecycle, ledger.conn.close


def ours(path: Path, *, encrypt: bool) -> tuple[Lifecycle, Callable[[], None]]:
    ledger = DeliveryLedger.open(path, encrypt=encrypt)
    with ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute("PRAGMA synchronous")
        assert c.fetchone()[0] == 2  # FULL, the library's (and SQLite's) default

    def lifecycle(n: int) -> None:
        key, chat, content = work(n, n % 7)
        oid = compute_obligation_id(key, f"in-{n}", content)
        ledger.record_obligation(
            obligation_id=oid,
            session_key=key,
            platform="telegram",
            chat_id=chat,
            content=content,
        )
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid, "1")

    return lifecycle, ledger.close


SIDES = ("base", "ours", "clear")


def compare(tmp: Path, per_segment: int, segments: int) -> tuple[dict[str, list[float]], CpuMeter]:
    """Seconds per segment of each side, and each side's CPU seconds in all."""
    opened = {
        "base": baseline(tmp / "base.db"),
        "ours": ours(tmp / "ours.db", encrypt=True),
        "clear": ours(tmp / "clear.db", encrypt=False),
    }
    for lifecycle, _ in opened.values():  # warm-up: tables, connections, data keys
        for n in range(per_segment):
            lifecycle(n)
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    meter = CpuMeter()
    for turn in range(segments):
        first = (turn + 1) * per_segment
        order = SIDES[turn % 3 :] + SIDES[: turn % 3]
        meter.sample()
        for name in order:
            lifecycle = opened[name][0]
            cpu_before = cpu_seconds()
            started = time.perf_counter()
            for n in range(first, first + per_segment):
                lifecycle(n)
            times[name].append(time.perf_counter() - started)
            meter.add(name, cpu_seconds() - cpu_before)
    for _, close in opened.values():
        close()
    meter.close()
    return times, meter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer segments (CI smoke run)")
    parser.add_argument("--segments", type=int, default=0, help="turns per side (default 15)")
    parser.add_argument("--per-segment", type=int, default=100, help="lifecycles per segment")
    parser.add_argument(
        "--dir",
        default=None,
        help="where the stores go (default: the system's temporary folder); on a memory"
        " file system (/dev/shm) commits cost no disk flush, which shows the CPU-bound ratio",
    )
    args = parser.parse_args()
    segments = args.segments or (3 if args.quick else 15)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ledger-bench-sync-", dir=args.dir))
    times, meter = compare(tmp, args.per_segment, segments)
    n = args.per_segment * segments
    rate = {name: n / sum(t) for name, t in times.items()}
    turns = sorted(b / o for b, o in zip(times["base"], times["ours"], strict=True))
    q = len(turns) // 4
    ratio = rate["ours"] / rate["base"]
    print(f"machine: {machine()}")
    print(
        "record -> attempting -> delivered, one lifecycle at a time, synchronous API;"
        f" SQLite WAL, synchronous=FULL on every side, in {tmp.parent};"
        f" {segments} interleaved segments of {args.per_segment} lifecycles per side"
    )
    print(
        "| mutable-row baseline | DeliveryLedger | ratio | encrypt=False | ratio"
        " | CPU per lifecycle: baseline, ours, encrypt=False |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {rate['base']:,.0f}/s | {rate['ours']:,.0f}/s | {ratio:.2f}x"
        f" ({turns[q]:.2f}-{turns[-1 - q]:.2f}) | {rate['clear']:,.0f}/s"
        f" | {rate['clear'] / rate['base']:.2f}x"
        f" | {meter.cell('base', n)}; {meter.cell('ours', n)}; {meter.cell('clear', n)} |"
    )
    print(f"target >= 0.5x -> {ratio:.2f}x; u = {meter.describe()}")


if __name__ == "__main__":
    main()
