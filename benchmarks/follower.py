"""What a view follower saves a host's sweep (ADR 0025).

Between two sweeps of one host, other hosts deliver replies: their events land in the
shared log, and the sweep catches its view up over all of them before it can claim. A
follower (``gateway-ledger projections follow``, in a process of its own, as an operator
runs it) applies them as they land, so the sweep starts from a current view.

Per round: another host writes ``--between`` delivered replies (three events each, many
per transaction) and leaves 100 orphans; then a host opens the ledger and sweeps. Timed:
the sweep, without a follower and with one running. With the follower, the sweep starts
once the follower has caught up (printed too: how long after the last commit). And the
CPU of a view catch-up per event: after each round's writes, both views
(``recoverable_obligations``, ``obligation_index``) caught up in this process as the
follower does (one read and decode of each batch for both), its
``getrusage`` CPU divided by the events applied, also in reference units ("u",
``reference.py``, timed in the same run).

    python benchmarks/follower.py [--backend sqlite|postgres] [--between N] [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from privacy import drop
from reference import CpuMeter, cpu_seconds, machine
from sweep import PG_BASE_URL, dead_owner, orphan, timed, write_history

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.views.sql_view import catch_up_views
from gateway_ledger.projections.delivery.catalog import projection_status

ORPHANS = 100
SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


def write_round(location: str, round_: int, between: int) -> None:
    write_history(location, between, prefix=f"r{round_}-")
    orphan(location, round_, ORPHANS)


def caught_up(location: str, timeout: float = 60.0) -> float:
    """Seconds until every view reflects the newest event (polled from outside)."""
    ledger = DeliveryLedger.open(location, owner=dead_owner(9999))
    try:
        started = time.perf_counter()
        newest = ledger.recorder.max_notification_id()
        while any(
            projection_status(ledger, name).position < newest
            for name in ("recoverable_obligations", "obligation_index")
        ):
            if time.perf_counter() - started > timeout:
                raise SystemExit("the follower did not catch up")
            time.sleep(0.005)
        return time.perf_counter() - started
    finally:
        ledger.close()


def sweep(location: str) -> float:
    ledger = DeliveryLedger.open(location)
    try:
        ms, won = timed(ledger.sweep_recoverable)
        assert len(won) == ORPHANS, (len(won), ledger.last_sweep)
        for item in won:  # untimed: the redelivery succeeds
            ledger.mark_delivered(item["obligation_id"])
        return ms
    finally:
        ledger.close()


def catch_up_cost(location: str, rounds: int, between: int) -> tuple[float, CpuMeter, int]:
    """CPU seconds of catching both views up over each round's events, in all, with the
    meter that timed the reference beside it, and the events applied."""
    meter = CpuMeter()
    total, applied = 0.0, 0
    for r in range(rounds):
        write_round(location, r, between)
        ledger = DeliveryLedger.open(location)
        meter.sample()
        cpu = cpu_seconds()
        # As ``projections follow`` does: one read and one decode of each batch for both.
        count = catch_up_views([ledger.recoverable, ledger.obligation_index])[0]
        total += cpu_seconds() - cpu
        applied += count
        for item in ledger.sweep_recoverable():  # untimed, as a host would next
            ledger.mark_delivered(item["obligation_id"])
        ledger.close()
    meter.close()
    return total, meter, applied


def measure(location: str, rounds: int, between: int, follow: bool) -> tuple[float, float]:
    follower = None
    if follow:
        follower = subprocess.Popen(
            [SCRIPT, "projections", "follow", "--db", location],
            stdout=subprocess.DEVNULL,
        )
    sweeps, lags = [], []
    try:
        for r in range(rounds):
            write_round(location, r, between)
            if follower is not None:
                lags.append(caught_up(location) * 1000)
            sweeps.append(sweep(location))
    finally:
        if follower is not None:
            follower.terminate()
            follower.wait(30)
    return statistics.median(sweeps), statistics.median(lags) if lags else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--between", type=int, default=2000, help="replies between sweeps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="500 replies between, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.between, args.rounds = 500, 2
    results = {}

    def fresh() -> str:
        if args.backend == "postgres":
            location = f"{PG_BASE_URL}?schema=bench_follow_{uuid.uuid4().hex[:8]}"
        else:
            location = str(Path(tempfile.mkdtemp(prefix="gl-follow-")) / "ledger.db")
        DeliveryLedger.open(location).close()  # the tables exist before the follower starts
        return location

    for follow in (False, True):
        location = fresh()
        results[follow] = measure(location, args.rounds, args.between, follow)
        if args.backend == "postgres":
            drop(location)
    location = fresh()
    catch_cpu, meter, applied = catch_up_cost(location, args.rounds, args.between)
    if args.backend == "postgres":
        drop(location)
    (alone, _), (followed, lag) = results[False], results[True]
    print(f"machine: {machine()}")
    print(
        f"{args.backend}: sweep of {ORPHANS} orphans after {args.between:,} replies"
        f" ({3 * args.between:,} events) from other hosts, median of {args.rounds} rounds"
    )
    print(
        "| sweep without a follower | with `projections follow` running | ratio"
        " | follower caught up |"
    )
    print("| ---: | ---: | ---: | ---: |")
    print(
        f"| {alone:.1f} ms | {followed:.1f} ms | {followed / alone:.2f}x"
        f" | {lag:.0f} ms after the last commit |"
    )
    per_event = catch_cpu / applied
    print(
        f"view catch-up (both views), process CPU per event: {1e6 * per_event:.1f} µs"
        f" = {per_event / meter.unit:.3f} u over {applied:,} events; {meter.describe()}"
    )


if __name__ == "__main__":
    main()
