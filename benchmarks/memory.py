"""A gateway's resident set while it delivers 100,000 replies: flat, nothing kept per reply.

``Gateway.deliver`` with a platform that answers at once, 64 concurrent conversations,
encryption on, until 100,000 replies are delivered (``--replies``); after each 10,000 the
gateway is flushed and the process's resident set is read: current (``/proc/self/statm``)
and peak (``getrusage``'s ``ru_maxrss``). What is kept per reply after it settles shows as
growth between 10,000 and 100,000; the baseline is the same process at 10,000, in the same
run. Also printed: the CPU per lifecycle, and in reference units (``reference.py``).

    python benchmarks/memory.py [--quick] [--replies N] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import CONCURRENCY, Ours, drop_schema, our_location
from reference import CpuMeter, cpu_seconds, current_rss_mib, machine, peak_rss_mib

STEP = 10_000


async def run(location: Path | str, replies: int) -> tuple[list[tuple[int, float, float]], float]:
    ours = await Ours.open(location, encrypt=True)
    rows = []
    per_conv = -(-STEP // CONCURRENCY)  # 157 per conversation: 10,048 per step
    done = 0
    cpu = cpu_seconds()
    try:
        while done < replies:
            await ours.segment(done // CONCURRENCY, per_conv, CONCURRENCY)
            done += per_conv * CONCURRENCY
            gc.collect()
            rows.append((done, current_rss_mib(), peak_rss_mib()))
            print(
                f"  {done:>7,} delivered: RSS {rows[-1][1]:.1f} MiB, peak {rows[-1][2]:.1f}",
                file=sys.stderr,
            )
        cpu = cpu_seconds() - cpu
    finally:
        await ours.close()
    return rows, cpu / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 replies")
    parser.add_argument("--replies", type=int, default=0, help="default 100,000")
    parser.add_argument("--postgres", metavar="URL", default=None)
    args = parser.parse_args()
    replies = args.replies or (20_000 if args.quick else 100_000)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ledger-bench-mem-"))
    location = our_location(tmp, "memory", args.postgres)
    meter = CpuMeter()
    try:
        rows, cpu = asyncio.run(run(location, replies))
    finally:
        drop_schema(location)
    meter.close()
    base = rows[0]
    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"machine: {machine()}")
    print(
        f"Gateway.deliver, {CONCURRENCY} concurrent conversations, encryption on, {store};"
        f" resident set after each {STEP:,} delivered (flushed, after a gc.collect())"
    )
    print(f"| delivered | RSS now | peak RSS (ru_maxrss) | RSS vs at {base[0]:,} |")
    print("| ---: | ---: | ---: | ---: |")
    for done, now, peak in rows:
        print(f"| {done:,} | {now:.1f} MiB | {peak:.1f} MiB | {now - base[1]:+.1f} MiB |")
    last = rows[-1]
    per_reply = (last[1] - base[1]) * 1024 * 1024 / max(1, last[0] - base[0])
    print(
        f"growth from {base[0]:,} to {last[0]:,}: {last[1] - base[1]:+.1f} MiB"
        f" ({per_reply:+.1f} bytes per reply); CPU per lifecycle {1e6 * cpu:.0f} µs"
        f" = {cpu / meter.unit:.2f} u ({meter.describe()})"
    )


if __name__ == "__main__":
    main()
