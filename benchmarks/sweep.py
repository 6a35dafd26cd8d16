"""The recovery sweep costs what is outstanding, not what happened before.

Two stores, measured in one run: a *small* one holding only the orphaned obligations,
and a *large* one that also holds a long delivered history (100,000 obligations, 300,000
events). In each, a dead gateway leaves 100 obligations pending; a new process opens the
ledger and sweeps. Reported: the sweep (catch the view up over the orphans' events, then
claim all 100), opening the ledger + catching the view up at boot when there is nothing
new (the view resumes from its tracked position), and, for scale, what replaying the
whole history would cost (a rebuild of the view). Each figure is the median of several
rounds; between rounds the claimed obligations are delivered (untimed). The sweep's
process CPU (``getrusage``, median of the rounds) is printed too, and in reference units
("u", ``reference.py``, timed in the same run); on Linux also the bytes the sweep's process
wrote and read on SQLite (``/proc/self/io``: the WAL frames of its commits and the pages it
read back, which show what a sweep pays per store size, docs/performance.md round 24;
libpq's socket sends and receives are not counted there, so PostgreSQL has no such row).

    python benchmarks/sweep.py [--quick] [--backend sqlite|postgres|both] [--rounds N]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import boot_id

PG_BASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
CONVERSATIONS = 1000  # session keys the history cycles through


def dead_owner(n: int) -> OwnerIdentity:
    return OwnerIdentity(
        host=socket.gethostname(), boot_id=boot_id(), pid=900_000_000 + n, start_time=1
    )


def write_history(location: str, delivered: int, batch: int = 1000, prefix: str = "hist-") -> None:
    """Delivered obligations, three events each, saved many aggregates per transaction."""
    ledger = DeliveryLedger.open(location, owner=dead_owner(0))
    for start in range(0, delivered, batch):
        aggregates = []
        for i in range(start, min(start + batch, delivered)):
            agg = ledger.new_obligation(
                obligation_id=f"{prefix}{i:07d}",
                session_key=f"agent:main:telegram:dm:{i % CONVERSATIONS}",
                platform="telegram",
                chat_id=str(i % CONVERSATIONS),
                content=f"reply number {i}",
            )
            agg.start_attempt(by=ledger.owner, now=ledger.clock())
            agg.confirm_delivery(by=ledger.owner, now=ledger.clock(), receipt=[str(i)])
            aggregates.append(agg)
        ledger.save(*aggregates)
    ledger.close()


def orphan(location: str, round_: int, count: int) -> None:
    """A gateway records ``count`` replies, starts sending half of them, and dies."""
    ledger = DeliveryLedger.open(location, owner=dead_owner(round_ + 1))
    aggregates = []
    for i in range(count):
        agg = ledger.new_obligation(
            obligation_id=f"orphan-{round_}-{i:04d}",
            session_key=f"agent:main:telegram:dm:{i}",
            platform="telegram",
            chat_id=str(i),
            content=f"unsent reply {i}",
        )
        if i % 2:
            agg.start_attempt(by=ledger.owner, now=ledger.clock())
        aggregates.append(agg)
    ledger.save(*aggregates)
    ledger.close()


def io_kib() -> tuple[float, float] | None:
    """KiB this process has written and read so far (``wchar``, ``rchar``; Linux only)."""
    try:
        with open("/proc/self/io") as f:
            counters = dict(line.split(": ") for line in f.read().splitlines())
    except OSError:
        return None
    return int(counters["wchar"]) / 1024, int(counters["rchar"]) / 1024


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return (time.perf_counter() - started) * 1000, result


def measure(location: str, rounds: int, orphans: int, meter: CpuMeter) -> dict[str, float]:
    sweeps, boots, cpus, written, read = [], [], [], [], []
    for r in range(rounds):
        orphan(location, r, orphans)
        ledger = DeliveryLedger.open(location)
        meter.sample()
        cpu, io = cpu_seconds(), io_kib()
        ms, won = timed(ledger.sweep_recoverable)
        cpus.append(cpu_seconds() - cpu)
        io_after = io_kib()
        if io is not None and io_after is not None:
            written.append(io_after[0] - io[0])
            read.append(io_after[1] - io[1])
        assert len(won) == orphans, (len(won), ledger.last_sweep)
        sweeps.append(ms)
        for item in won:  # untimed: the redelivery succeeds
            ledger.mark_delivered(item["obligation_id"])
        ledger.recoverable.catch_up()
        ledger.close()

        def boot() -> int:
            booted = DeliveryLedger.open(location)
            applied = booted.recoverable.catch_up()
            booted.close()
            return applied

        ms, applied = timed(boot)
        assert applied == 0
        boots.append(ms)
    return {
        "sweep": statistics.median(sweeps),
        "boot": statistics.median(boots),
        "cpu": statistics.median(cpus),
        "written": statistics.median(written) if written else float("nan"),
        "read": statistics.median(read) if read else float("nan"),
    }


def rebuild_ms(location: str) -> tuple[float, int]:
    ledger = DeliveryLedger.open(location)
    ms, applied = timed(ledger.recoverable.rebuild)
    ledger.close()
    return ms, applied


def locations(backend: str, tmp: Path) -> tuple[str, str, Callable[[], None]]:
    if backend == "sqlite":
        return str(tmp / "small.db"), str(tmp / "large.db"), lambda: None
    tag = uuid.uuid4().hex[:8]
    small = f"{PG_BASE_URL}?schema=bench_small_{tag}"
    large = f"{PG_BASE_URL}?schema=bench_large_{tag}"

    def drop() -> None:
        from psycopg import sql

        from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

        for url in (small, large):
            params = parse_postgres_url(url)
            with connect(params) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(params["schema"])
                    )
                )

    return small, large, drop


def run(backend: str, delivered: int, orphans: int, rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        small, large, drop = locations(backend, Path(tmp))
        try:
            started = time.perf_counter()
            write_history(large, delivered)
            built = time.perf_counter() - started
            first_ms, first_applied = rebuild_ms(large)  # the one-time catch-up of the history
            print(
                f"[{backend}] history: {delivered:,} delivered ({3 * delivered:,} events) "
                f"written in {built:.1f} s; first view build {first_ms / 1000:.1f} s",
                file=sys.stderr,
            )
            DeliveryLedger.open(small).recoverable.catch_up()
            meter = CpuMeter()
            base = measure(small, rounds, orphans, meter)
            big = measure(large, rounds, orphans, meter)
            meter.close()
        finally:
            drop()
    rows = [
        (
            f"sweep claiming {orphans} orphans",
            base["sweep"],
            big["sweep"],
        ),
        ("open + view catch-up at boot", base["boot"], big["boot"]),
    ]
    lines = []
    for name, b, g in rows:
        lines.append(
            f"| {backend} | {name} | {orphans} only | {b:.1f} | "
            f"+{delivered:,} delivered | {g:.1f} | {g / b:.2f}x |"
        )
    lines.append(
        f"| {backend} | replaying the history instead (view rebuild) | | | "
        f"{first_applied:,} events | {first_ms:,.0f} | |"
    )
    unit = meter.unit
    lines.append(
        f"| {backend} | sweep's process CPU, ms (u = {1e6 * unit:.0f} µs) | {orphans} only"
        f" | {1e3 * base['cpu']:.1f} = {base['cpu'] / unit:.0f} u | +{delivered:,} delivered"
        f" | {1e3 * big['cpu']:.1f} = {big['cpu'] / unit:.0f} u | {big['cpu'] / base['cpu']:.2f}x |"
    )
    if backend == "sqlite":  # libpq's socket traffic is not in /proc/self/io
        for key in ("written", "read"):
            lines.append(
                f"| {backend} | sweep's process I/O, KiB {key} | {orphans} only"
                f" | {base[key]:,.0f} | +{delivered:,} delivered | {big[key]:,.0f}"
                f" | {big[key] / base[key]:.2f}x |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 delivered, 3 rounds")
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--delivered", type=int)
    parser.add_argument("--orphans", type=int, default=100)
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    delivered = args.delivered or (10_000 if args.quick else 100_000)
    rounds = args.rounds or (3 if args.quick else 5)
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    lines = []
    for backend in backends:
        lines += run(backend, delivered, args.orphans, rounds)
    print(f"machine: {machine()}")
    print("| store | operation | baseline | ms | large store | ms | ratio |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for line in lines:
        print(line)
    print("(target: sweep ratio within 1.5x and under 50 ms; medians of", rounds, "rounds)")


if __name__ == "__main__":
    main()
