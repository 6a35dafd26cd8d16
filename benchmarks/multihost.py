"""Throughput on PostgreSQL next to SQLite, with 1 and 4 writer processes, in one run.

Measured per store and writer count (each writer a real process, released together):

- ledger lifecycles/s: record -> attempting -> delivered through ``DeliveryLedger``
  (three commits per reply);
- gateway lifecycles/s: ``Gateway.deliver`` with an adapter that answers at once, 8 replies
  in flight per process (group commit: record+attempting, then delivered);
- claims/s: a dead gateway left obligations pending; the writers sweep at once, and
  each obligation is claimed exactly once (checked).

Ratios are against SQLite with one writer, measured in the same run. PostgreSQL runs with
leases on (its default); SQLite with /proc liveness (its default). Also printed: the CPU
per lifecycle of the writer processes (``getrusage`` in each, opening the store included),
in reference units too ("u", ``reference.py``, timed in each writer process).

    python benchmarks/multihost.py [--quick] [--backend sqlite|postgres|both]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import boot_id

PG_BASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
SPAWN = multiprocessing.get_context("spawn")
IN_FLIGHT = 8


class InstantAdapter(AdapterBase):
    platform = "telegram"

    async def send(self, target: Any, content: str, **_: Any) -> SendResult:
        return SendResult.ok("m")


def ledger_worker(location: str, writer: int, count: int) -> None:
    ledger = DeliveryLedger.open(location)
    for i in range(count):
        oid = ledger.record_obligation(
            obligation_id=f"l-{writer}-{i}",
            session_key=f"agent:main:telegram:dm:{writer}-{i}",
            platform="telegram",
            chat_id=str(i),
            content=f"reply {i}",
        )
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid, [str(i)])
    ledger.close()


def gateway_worker(location: str, writer: int, count: int) -> None:
    async def main() -> None:
        async with Gateway.open(location) as gw:
            await gw.start([InstantAdapter()])

            async def conversation(c: int) -> None:
                ctx = ReplyContext(
                    session_key=f"agent:main:telegram:dm:{writer}-{c}",
                    platform="telegram",
                    chat_id=str(c),
                )
                for i in range(c, count, IN_FLIGHT):
                    out = await gw.deliver(ctx, Reply(f"reply {i}"), f"in-{i}")
                    assert out.status == "delivered", out

            await asyncio.gather(*(conversation(c) for c in range(IN_FLIGHT)))

    asyncio.run(main())


def sweep_worker(location: str, writer: int, count: int) -> int:
    ledger = DeliveryLedger.open(location)
    ledger.recoverable.catch_up()
    return len(ledger.sweep_recoverable())


def _run(target: Any, location: str, writer: int, count: int, barrier: Any, out: Any) -> None:
    if target is sweep_worker:
        DeliveryLedger.open(location).recoverable.catch_up()  # warm: the view is current
    meter = CpuMeter()  # the reference unit, as the other benchmarks take it: a mean
    meter.sample()
    meter.sample()
    unit = meter.unit
    barrier.wait()
    started = time.perf_counter()
    cpu = cpu_seconds()
    result = target(location, writer, count)
    cpu = cpu_seconds() - cpu
    out.put((started, time.perf_counter(), result, cpu, unit))


def timed(target: Any, location: str, writers: int, count: int) -> tuple[float, list[Any]]:
    """Wall seconds from the first start to the last end, and each writer's result."""
    wall, results, _cpu, _units = timed_cpu(target, location, writers, count)
    return wall, results


def timed_cpu(
    target: Any, location: str, writers: int, count: int
) -> tuple[float, list[Any], float, float]:
    """Also the writers' CPU seconds in all, and their CPU in reference units."""
    barrier, out = SPAWN.Barrier(writers), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_run, args=(target, location, w, count, barrier, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        assert p.exitcode == 0
    wall = max(r[1] for r in results) - min(r[0] for r in results)
    return (
        wall,
        [r[2] for r in results],
        sum(r[3] for r in results),
        sum(r[3] / r[4] for r in results),
    )


def orphans(location: str, count: int) -> None:
    dead = OwnerIdentity(
        host=socket.gethostname(), boot_id=boot_id(), pid=900_000_123, start_time=1
    )
    ledger = DeliveryLedger.open(location, owner=dead)
    for start in range(0, count, 250):
        ledger.save(
            *(
                ledger.new_obligation(
                    obligation_id=f"o-{i}",
                    session_key=f"agent:main:telegram:dm:{i}",
                    platform="telegram",
                    chat_id=str(i),
                    content=f"reply {i}",
                )
                for i in range(start, min(start + 250, count))
            )
        )
    ledger.close()


def fresh(backend: str, tmp: Path) -> tuple[str, Any]:
    if backend == "sqlite":
        return str(tmp / f"{uuid.uuid4().hex}.db"), None
    url = f"{PG_BASE_URL}?schema=bench_{uuid.uuid4().hex[:10]}"
    return url, url


def drop(url: str | None) -> None:
    if url is None:
        return
    from psycopg import sql

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    params = parse_postgres_url(url)
    with connect(params) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(params["schema"]))
        )


def measure(backend: str, writers: int, sizes: dict[str, int], tmp: Path) -> dict[str, float]:
    rates = {}
    for name, worker in (("ledger", ledger_worker), ("gateway", gateway_worker)):
        location, url = fresh(backend, tmp)
        DeliveryLedger.open(location).close()  # schema and tables exist before timing
        per_writer = sizes[name] // writers
        wall, _, cpu, units = timed_cpu(worker, location, writers, per_writer)
        rates[name] = per_writer * writers / wall
        rates[f"{name}_cpu"] = cpu / (per_writer * writers)
        rates[f"{name}_u"] = units / (per_writer * writers)
        drop(url)
    location, url = fresh(backend, tmp)
    orphans(location, sizes["claims"])
    wall, won = timed(sweep_worker, location, writers, 0)
    assert sum(won) == sizes["claims"], (won, sizes["claims"])  # each claimed exactly once
    rates["claims"] = sizes["claims"] / wall
    drop(url)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    sizes = (
        {"ledger": 120, "gateway": 240, "claims": 200}
        if args.quick
        else {"ledger": 800, "gateway": 1600, "claims": 1000}
    )
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            for writers in (1, 4):
                rows.append((backend, writers, measure(backend, writers, sizes, Path(tmp))))
                print(f"measured {backend} x{writers}", file=sys.stderr)
    base = rows[0][2]
    print(f"machine: {machine()}")
    print(
        "| store | writers | ledger lifecycles/s | ratio | gateway lifecycles/s | ratio "
        "| claims/s | ratio | CPU per lifecycle: ledger, gateway |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for backend, writers, r in rows:
        cells = []
        for key in ("ledger", "gateway", "claims"):
            cells += [f"{r[key]:.0f}", f"{r[key] / base[key]:.2f}x"]
        cells.append(
            f"{1e6 * r['ledger_cpu']:,.0f} µs = {r['ledger_u']:.2f} u;"
            f" {1e6 * r['gateway_cpu']:,.0f} µs = {r['gateway_u']:.2f} u"
        )
        print(f"| {backend} | {writers} | " + " | ".join(cells) + " |")
    print(
        f"(ratios against {rows[0][0]} x{rows[0][1]}; {sizes['ledger']} ledger and "
        f"{sizes['gateway']} gateway lifecycles, {sizes['claims']} claims per cell; "
        "2-core shared machine)"
    )


if __name__ == "__main__":
    main()
