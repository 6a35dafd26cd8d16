"""Where a lifecycle's CPU goes: per thread, in the kernel, and in bytes written.

``Gateway.deliver`` with a platform that answers at once, encryption on, in the two shapes
of ``delivery.py``: (a) one conversation at a time, (b) 64 concurrent conversations. After
a warm-up segment, one timed segment; per lifecycle it prints:

- the wall time, and the CPU time of each thread (``/proc/self/task/*/schedstat``, time
  on a CPU, user and system together): the event loop's and the writer's, where the group
  commit maps, seals and commits. Where the two threads' CPU adds up to more than the
  wall time, they ran side by side; where it adds up to the wall time, they took turns
  (docs/performance.md, rounds 13 and 15);
- the process's user and system time (``getrusage``), and in reference units
  (``reference.py``);
- voluntary context switches (a thread that slept: a wake-up, a lock wait, an fsync);
- bytes and write calls the process wrote (``/proc/self/io``: ``wchar``, ``syscw``), and the
  bytes it read back (``rchar``: the WAL checkpoint reading its log);
- commits, and the stored events' bytes per lifecycle (what a lifecycle adds to the store);
- the garbage collector: collections of each generation per 1,000 lifecycles, and the time
  spent in them per lifecycle (``gc.callbacks``; the collector runs on whichever thread
  allocates, holding the interpreter lock, so its wall time is CPU time), and the longest
  collection: a pause of every conversation on the loop.

- the Python function calls the event loop made per lifecycle, counted by ``cProfile`` in a
  third segment after the timed one (the counting slows it; it is not timed): a figure of
  the loop's work that does not depend on the machine or its neighbours, so a removal too
  small to see in the noise of a shared VM's timings still shows in it;
- the young objects a collection of the youngest generation found, at the median, and
  the share of them that were closures' cells: what replies in flight keep alive (each
  reply's frames hold them until it settles), which sets how often the collector runs.

``--freeze-gc`` calls ``gc.freeze()`` after the warm-up segment, as docs/delivery.md
advises a gateway to do once it has started: what was alive then (modules, classes, the
ledger's and the platforms' long-lived objects) is never scanned again, so a full
collection walks only what the replies in flight hold. The collector belongs to the
process, so the library never does this itself (docs/performance.md, round 14).

No baseline: this is the budget of ``delivery.py``'s figures, not a target (Linux only).

    python benchmarks/threads.py [--quick] [--postgres URL] [--freeze-gc]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import resource
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import CONCURRENCY, Ours, drop_schema, our_location
from reference import CpuMeter, machine


def thread_cpu_ns() -> dict[str, int]:
    """Nanoseconds each live thread of this process spent on a CPU, by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran = int(f.read().split()[0])
        except OSError:  # ended meanwhile
            continue
        name = names.get(int(tid), "other")
        if name.startswith("gateway-ledger-writer"):
            name = "writer"
        elif name == "MainThread":
            name = "loop"
        elif not name.startswith("gateway-ledger-reader"):
            name = "other"
        else:
            name = "reader"
        out[name] = out.get(name, 0) + ran
    return out


class CollectorClock:
    """Collections of each generation, the seconds spent in them and the longest one (the
    longest the event loop was held by the collector), while installed."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self.longest = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            took = time.perf_counter() - self._started
            self.seconds += took
            self.longest = max(self.longest, took)
            self.collections[info["generation"]] += 1

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


class YoungCensus:
    """The youngest generation's objects at the start of its collections, while installed:
    their number each time, and how many of all were cells (a closure's captured names)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.cells = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            young = gc.get_objects(0)
            self.sizes.append(len(young))
            # One comprehension, not a generator: the profiled segment counts every
            # resumption of a generator as a call, and this runs on the loop's thread.
            self.cells += [type(o) for o in young].count(types.CellType)
            del young

    def median(self) -> float:
        return float(statistics.median(self.sizes)) if self.sizes else 0.0

    def cells_percent(self) -> float:
        total = sum(self.sizes)
        return 100.0 * self.cells / total if total else 0.0

    def __enter__(self) -> YoungCensus:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines())}


async def measure(
    location: Path | str, concurrency: int, lifecycles: int, freeze: bool
) -> dict[str, float]:
    ours = await Ours.open(location, encrypt=True)
    per_conv = max(1, lifecycles // concurrency)
    done = per_conv * concurrency
    try:
        await ours.segment(0, per_conv, concurrency)  # warm-up
        if freeze:
            gc.collect()
            gc.freeze()
        commits = ours.gateway.stats().commits
        threads, io = thread_cpu_ns(), io_counters()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        with CollectorClock() as collector:
            await ours.segment(per_conv, per_conv, concurrency)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        threads_after, io_after = thread_cpu_ns(), io_counters()
        commits = ours.gateway.stats().commits - commits
        profile = cProfile.Profile()
        with YoungCensus() as census:
            profile.enable()
            try:
                await ours.segment(2 * per_conv, per_conv, concurrency)
            finally:
                profile.disable()
        calls = pstats.Stats(profile).total_calls
    finally:
        await ours.close()
        if freeze:
            gc.unfreeze()
    row = {"wall µs": 1e6 * wall / done}
    row |= {f"{k} µs": (v - threads.get(k, 0)) / 1e3 / done for k, v in threads_after.items()}
    row["user µs"] = 1e6 * (after.ru_utime - usage.ru_utime) / done
    row["system µs"] = 1e6 * (after.ru_stime - usage.ru_stime) / done
    row["switches"] = (after.ru_nvcsw - usage.ru_nvcsw) / done
    row["written bytes"] = (io_after["wchar"] - io["wchar"]) / done
    row["write calls"] = (io_after["syscw"] - io["syscw"]) / done
    row["read bytes"] = (io_after["rchar"] - io["rchar"]) / done
    row["commits"] = commits / done
    for generation, count in enumerate(collector.collections):
        row[f"gen{generation} collections per 1,000"] = 1000 * count / done
    row["collector µs"] = 1e6 * collector.seconds / done
    row["longest collection ms"] = 1e3 * collector.longest
    row["loop: Python calls"] = calls / done
    row["young objects at a collection (median)"] = census.median()
    row["of them cells, %"] = census.cells_percent()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer lifecycles")
    parser.add_argument("--postgres", metavar="URL", default=None)
    parser.add_argument(
        "--freeze-gc", action="store_true", help="gc.freeze() after the warm-up segment"
    )
    args = parser.parse_args()
    shapes = {
        "(a) one conversation": (1, 500 if args.quick else 2_000),
        f"(b) {CONCURRENCY} conversations": (CONCURRENCY, 3_200 if args.quick else 12_800),
    }
    meter = CpuMeter()
    rows: dict[str, dict[str, float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ledger-bench-threads-"))
    for shape, (concurrency, lifecycles) in shapes.items():
        location = our_location(tmp, f"threads-{concurrency}", args.postgres)
        meter.sample()
        try:
            rows[shape] = asyncio.run(measure(location, concurrency, lifecycles, args.freeze_gc))
        finally:
            drop_schema(location)
    meter.close()
    store = "PostgreSQL" if args.postgres else "SQLite"
    frozen = ", gc.freeze() after the warm-up" if args.freeze_gc else ""
    print(f"machine: {machine()}")
    print(
        f"per lifecycle, Gateway.deliver, encryption on, {store}{frozen}"
        " (thread CPU from schedstat)"
    )
    keys = [k for k in next(iter(rows.values())) if not k.startswith(("reader", "other"))]
    print("| figure | " + " | ".join(rows) + " |")
    print("| --- | " + " | ".join("---:" for _ in rows) + " |")
    for key in keys:
        cells = [f"{row.get(key, 0.0):,.2f}" for row in rows.values()]
        print(f"| {key} | " + " | ".join(cells) + " |")
    units = [
        f"{(row['user µs'] + row['system µs']) / 1e6 / meter.unit:.2f} u" for row in rows.values()
    ]
    print("| user + system, reference units | " + " | ".join(units) + " |")
    print(f"u = reference units (reference.py): {meter.describe()}")


if __name__ == "__main__":
    main()
