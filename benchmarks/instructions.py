"""User-space instructions per lifecycle, ours and the mutable-row baseline, under callgrind.

A shared VM's timings move by tens of percent from one hour to the next; an instruction
count does not. ``valgrind --tool=callgrind`` counts the instructions a process executes
in user space (every thread: the event loop's and the writer's), the same for the same
code and inputs (the children run with one hash seed) whatever else the machine is
doing, and nearly the same on any x86-64 machine with the same Python and libraries.
So a change of a few percent in the CPU per reply, which ``delivery.py`` cannot tell from
noise, shows here.

Each contender runs in a child process under callgrind twice: a short run and a long one,
each a warm-up and then a segment of lifecycles (``delivery.py``'s contenders and
workload, encryption on, SQLite with ``synchronous=FULL``). Their difference divided by
the difference in lifecycles is the count per lifecycle: the imports, the opening and the
warm-up cancel out.

What it does not count: the kernel (system calls, the fsync, waking threads), which on
these VMs is a quarter of (a)'s CPU, and anything outside the process (with ``--postgres``,
the server). It also runs the threads one at a time, so a group commit at (b) may hold
other replies than it would natively; the count at (b) is steady between runs of this
script (within 2 %), not equal to a native run's. Use it for before/after pairs on one
checkout's scripts; ``threads.py`` and ``delivery.py`` say what the time and the kernel do.

    python benchmarks/instructions.py [--quick] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import machine

SHAPES = {"(a) one conversation": 1, "(b) 64 conversations": 64}
SIZES = {1: (64, 448), 64: (128, 1152)}  # lifecycles of the short and the long run
QUICK_SIZES = {1: (32, 160), 64: (64, 448)}
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _per_conversation(lifecycles: int, concurrency: int) -> int:
    """A run's lifecycles per conversation (the child's segment; the parent's divisor)."""
    return max(1, lifecycles // concurrency)


async def _child(contender: str, concurrency: int, lifecycles: int, location: str) -> None:
    from delivery import Baseline, Ours, drop_schema

    path = Path(location) if "://" not in location else location
    opened = (
        Baseline(Path(location)) if contender == "baseline" else await Ours.open(path, encrypt=True)
    )
    try:
        await opened.segment(0, 2, concurrency)  # warm-up: the same in both runs
        await opened.segment(2, _per_conversation(lifecycles, concurrency), concurrency)
    finally:
        await opened.close()
        drop_schema(path)


def _count(contender: str, concurrency: int, lifecycles: int, postgres: str | None) -> int:
    """Instructions of one child run under callgrind."""
    from delivery import our_location

    with tempfile.TemporaryDirectory(prefix="gateway-ledger-bench-instructions-") as tmp:
        if contender == "baseline":
            location = str(Path(tmp) / "baseline.db")
        else:
            location = str(our_location(Path(tmp), "instructions", postgres))
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            contender,
            str(concurrency),
            str(lifecycles),
            location,
        ]
        # One hash seed: string hashes, and so dict and set layouts, the same in every run.
        environment = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
        found = _COLLECTED.search(done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"callgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return int(found.group(1))


def per_lifecycle(
    contender: str, concurrency: int, sizes: tuple[int, int], pg: str | None
) -> float:
    short, long = sizes
    counts = [_count(contender, concurrency, n, pg) for n in (short, long)]
    done = [_per_conversation(n, concurrency) * concurrency for n in (short, long)]
    return (counts[1] - counts[0]) / (done[1] - done[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--postgres", metavar="URL", default=None, help="ours on PostgreSQL")
    parser.add_argument("--child", nargs=4, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        contender, concurrency, lifecycles, location = args.child
        asyncio.run(_child(contender, int(concurrency), int(lifecycles), location))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: this benchmark counts with callgrind")
    sizes = QUICK_SIZES if args.quick else SIZES
    store = "PostgreSQL (this process only, not the server)" if args.postgres else "SQLite"
    print(f"machine: {machine()}")
    print(
        f"user-space instructions per lifecycle (callgrind), encryption on, ours on {store};"
        f" Python {platform.python_version()}, {platform.machine()}"
    )
    print("| shape | baseline | ours | ours / baseline |")
    print("| --- | ---: | ---: | ---: |")
    for shape, concurrency in SHAPES.items():
        baseline = per_lifecycle("baseline", concurrency, sizes[concurrency], None)
        ours = per_lifecycle("ours", concurrency, sizes[concurrency], args.postgres)
        print(f"| {shape} | {baseline:,.0f} | {ours:,.0f} | {ours / baseline:.2f} |")


if __name__ == "__main__":
    main()
