"""Where a lifecycle's CPU goes: per thread, in the kernel, and in bytes written.

``Gateway.deliver`` with a platform that answers at once, encryption on, in the two shapes
of ``delivery.py``: (a) one conversation at a time, (b) 64 concurrent conversations. After
a warm-up segment, one timed segment; per lifecycle it prints:

- the CPU time of each thread (``/proc/self/task/*/schedstat``, time on a CPU, user and
  system together): the event loop's and the writer's, where the group commit maps, seals
  and commits;
- the process's user and system time (``getrusage``), and in reference units
  (``reference.py``);
- voluntary context switches (a thread that slept: a wake-up, a lock wait, an fsync);
- bytes and write calls the process wrote (``/proc/self/io``: ``wchar``, ``syscw``), and the
  bytes it read back (``rchar``: the WAL checkpoint reading its log);
- commits, and the stored events' bytes per lifecycle (what a lifecycle adds to the store).

No baseline: this is the budget of ``delivery.py``'s figures, not a target (Linux only).

    python benchmarks/threads.py [--quick] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import CONCURRENCY, Ours, drop_schema, our_location
from reference import CpuMeter


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


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines())}


async def measure(location: Path | str, concurrency: int, lifecycles: int) -> dict[str, float]:
    ours = await Ours.open(location, encrypt=True)
    per_conv = max(1, lifecycles // concurrency)
    done = per_conv * concurrency
    try:
        await ours.segment(0, per_conv, concurrency)  # warm-up
        commits = ours.gateway.stats().commits
        threads, io = thread_cpu_ns(), io_counters()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        await ours.segment(per_conv, per_conv, concurrency)
        after = resource.getrusage(resource.RUSAGE_SELF)
        threads_after, io_after = thread_cpu_ns(), io_counters()
        commits = ours.gateway.stats().commits - commits
    finally:
        await ours.close()
    row = {f"{k} µs": (v - threads.get(k, 0)) / 1e3 / done for k, v in threads_after.items()}
    row["user µs"] = 1e6 * (after.ru_utime - usage.ru_utime) / done
    row["system µs"] = 1e6 * (after.ru_stime - usage.ru_stime) / done
    row["switches"] = (after.ru_nvcsw - usage.ru_nvcsw) / done
    row["written bytes"] = (io_after["wchar"] - io["wchar"]) / done
    row["write calls"] = (io_after["syscw"] - io["syscw"]) / done
    row["read bytes"] = (io_after["rchar"] - io["rchar"]) / done
    row["commits"] = commits / done
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer lifecycles")
    parser.add_argument("--postgres", metavar="URL", default=None)
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
            rows[shape] = asyncio.run(measure(location, concurrency, lifecycles))
        finally:
            drop_schema(location)
    meter.close()
    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"per lifecycle, Gateway.deliver, encryption on, {store} (thread CPU from schedstat)")
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
