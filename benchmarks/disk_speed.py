"""Target (a) against the cost of a flush: the delivery benchmark on slower disks.

Target (a) of ``delivery.py`` (one conversation at a time, ours >= 1x the mutable-row
baseline) compares one commit plus a thread round trip and our Python (ours) with three
commits on the event loop (the baseline). Which side wins depends on what a flush costs
(ADR 0046; the development machine's disk sits near the break-even point,
docs/performance.md).
Most disks a gateway runs on flush slower than that (network block storage, SSDs without
power-loss protection), some faster (NVMe with it).

This re-runs scenario (a) of ``delivery.py`` in a child process per added delay, with a
small ``LD_PRELOAD`` shim that waits that long after every ``fsync``/``fdatasync`` the
process makes: both sides, in the same process, on the same disk, pay it on every flush
alike, as a slower disk would. The shim is compiled here with the system C compiler. Each
row also measures what one single-row commit (the baseline's unit) then costs.

    python benchmarks/disk_speed.py [--delays 0,25,50,100,250,1000] [--segments N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from delivery import compare
from floor import commits

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static long delay_ns;
static int (*real_fdatasync)(int);
static int (*real_fsync)(int);

__attribute__((constructor)) static void init(void) {
    const char *us = getenv("SLOW_FLUSH_US");
    delay_ns = us ? atol(us) * 1000L : 0;
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
}

static void slower(void) {
    /* Busy, not asleep: a sleeping thread adds its own wake-up, which is not the same
       on every vCPU of a VM; a busy wait adds exactly the delay, to either side. */
    struct timespec now, end;
    if (delay_ns <= 0) return;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_nsec += delay_ns;
    end.tv_sec += end.tv_nsec / 1000000000L;
    end.tv_nsec %= 1000000000L;
    do clock_gettime(CLOCK_MONOTONIC, &now);
    while (now.tv_sec < end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec < end.tv_nsec));
}

int fdatasync(int fd) { int r = real_fdatasync(fd); slower(); return r; }
int fsync(int fd) { int r = real_fsync(fd); slower(); return r; }
"""


def build_shim(folder: Path) -> Path:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("disk_speed.py needs a C compiler (cc or gcc) to build its shim")
    source, shim = folder / "slow_flush.c", folder / "slow_flush.so"
    source.write_text(SHIM)
    subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"], check=True
    )
    return shim


def child(segments: int) -> None:
    """In the shimmed process: one commit's cost, then scenario (a); one JSON line out."""
    maps = Path("/proc/self/maps").read_text()
    if "slow_flush.so" not in maps:
        raise SystemExit("the flush shim is not loaded (LD_PRELOAD was ignored)")
    with tempfile.TemporaryDirectory(prefix="gateway-ledger-disk-") as tmp:
        _ours, base = commits(Path(tmp), 600)
        times, _busy, _cpl, _cpu = asyncio.run(compare(Path(tmp), 1, 200, segments))
    total = {name: sum(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "commit_us": base / 3 * 1e6,
                "ratio": total["base"] / total["ours"],
                "base_us": total["base"] / (200 * segments) * 1e6,
                "ours_us": total["ours"] / (200 * segments) * 1e6,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays", default="0,25,50,100,250,1000", help="µs added per flush")
    parser.add_argument("--segments", type=int, default=8, help="turns per side and delay")
    parser.add_argument("--quick", action="store_true", help="+0 and +100 µs, 3 turns")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick and not args.child:
        args.delays, args.segments = "0,100", 3
    if args.child:
        child(args.segments)
        return
    delays = [int(d) for d in args.delays.split(",")]
    print(
        "scenario (a) of delivery.py, one conversation at a time, SQLite WAL,"
        f" synchronous=FULL, {args.segments} interleaved segments per side; every flush"
        " of the process made slower by the added delay"
    )
    print("| added per flush | one-row commit | baseline | gateway-ledger | ratio (a) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="gateway-ledger-shim-") as folder:
        shim = build_shim(Path(folder))
        for delay in delays:
            env = dict(os.environ, LD_PRELOAD=str(shim), SLOW_FLUSH_US=str(delay))
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--segments", str(args.segments)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(
                f"| +{delay} µs | {row['commit_us']:.0f} µs | {row['base_us']:.0f} µs/reply"
                f" | {row['ours_us']:.0f} µs/reply | {row['ratio']:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
