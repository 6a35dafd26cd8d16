"""A CPU figure that damps a shared machine's load: process CPU time, and a fixed reference.

Every delivery-path benchmark reports the CPU time its work cost (``getrusage``: user +
system time of the whole process, every thread, so the writer thread's commits count)
per lifecycle, and the same figure divided by the CPU time of a fixed pure-Python
workload timed in the same run (``reference_unit``). The second figure is "reference
units per lifecycle": when the neighbours or the clock slow this machine's Python down,
both the lifecycle and the unit take longer, and the quotient stays. Between CPU models
it does not (ADR 0069): their system calls, flushes and caches differ from their Python
speed, so a CPU target is judged by before/after pairs on one machine.

The workload does what the gateway's Python does most (ADR 0046, docs/performance.md):
builds small dicts and tuples, formats and joins strings, looks names up, calls small
functions, sorts a short list. It is never changed: figures taken with another workload
are not comparable. Timed as the best of several rounds (the least disturbed by the
machine's other work), and again at the end of a run, so a drift shows.

    python benchmarks/reference.py    # prints the unit on this machine
"""

from __future__ import annotations

import os
import platform
import resource
import sqlite3
import time
from dataclasses import dataclass, field

ROUNDS = 7
REPEAT = 50  # one unit = one call of ``_workload``; a round times REPEAT of them


def _first_line(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def machine() -> str:
    """What a figure needs beside it to be compared with another (ADR 0069): the CPU model
    and count, how the guest idles a vCPU (a halted one is slow to wake, and our side wakes
    a thread twice per reply at (a)), and Python's and SQLite's versions."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    idle = _first_line("/sys/devices/system/cpu/cpuidle/current_driver") or "unknown"
    poll = _first_line("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if poll:
        idle += f", guest_halt_poll_ns={poll}"
    return (
        f"{model} x {os.cpu_count()}, cpuidle {idle};"
        f" Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """The process's peak resident set so far (``ru_maxrss``, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """The process's resident set now, from ``/proc/self/statm`` (Linux), in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / (1024 * 1024)


def _step(i: int, names: tuple[str, ...]) -> tuple[str, int]:
    record = {"id": i, "name": names[i % len(names)], "size": i * 7 % 13, "tags": (i, i + 1)}
    text = f"{record['name']}:{record['id']}:{record['size']}"
    return "|".join((text, str(record["tags"][1]))), len(text)


def _workload() -> int:
    """About 100 µs of plain Python on a 2020s server core (never change it)."""
    names = ("telegram", "discord", "slack", "whatsapp", "google_chat")
    total = 0
    parts: list[str] = []
    for i in range(200):
        joined, n = _step(i, names)
        total += n
        if i % 20 == 0:
            parts.append(joined)
    parts.sort()
    return total + len(parts)


def reference_unit(rounds: int = ROUNDS) -> float:
    """CPU seconds of one reference unit on this machine now (best of ``rounds``)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(REPEAT):
            _workload()
        best = min(best, (time.process_time() - started) / REPEAT)
    return best


def reference_seconds(repeat: int = REPEAT) -> float:
    """Process CPU seconds of ``repeat`` reference units, run now."""
    started = cpu_seconds()
    for _ in range(repeat):
        _workload()
    return cpu_seconds() - started


@dataclass
class CpuMeter:
    """CPU seconds per named side, summed over segments timed with ``getrusage`` deltas,
    and the reference unit timed the same way, as one more side taking its turn.

    Call ``sample`` once per turn (or round): the reference then meets the same neighbours
    and the same CPU frequency as the sides it normalises, and the unit is the total
    reference CPU over the total units run."""

    seconds: dict[str, float] = field(default_factory=dict)
    ref_seconds: float = 0.0
    ref_units: int = 0
    samples: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        _workload()  # warm
        self.sample()

    def sample(self, repeat: int = REPEAT) -> None:
        seconds = reference_seconds(repeat)
        self.ref_seconds += seconds
        self.ref_units += repeat
        self.samples.append(seconds / repeat)

    def add(self, side: str, seconds: float) -> None:
        self.seconds[side] = self.seconds.get(side, 0.0) + seconds

    def close(self) -> None:
        self.sample()

    @property
    def unit(self) -> float:
        return self.ref_seconds / self.ref_units

    def per(self, side: str, count: int) -> float:
        """CPU µs per item of ``side``."""
        return 1e6 * self.seconds[side] / count

    def units(self, side: str, count: int) -> float:
        """Reference units per item of ``side``."""
        return self.seconds[side] / count / self.unit

    def describe(self) -> str:
        low, high = min(self.samples), max(self.samples)
        return (
            f"reference unit {1e6 * self.unit:.1f} µs CPU"
            f" (samples {1e6 * low:.0f}-{1e6 * high:.0f} µs, n={len(self.samples)})"
        )

    def cell(self, side: str, count: int) -> str:
        return f"{self.per(side, count):,.0f} µs = {self.units(side, count):.2f} u"


def main() -> None:
    units = [reference_unit() for _ in range(5)]
    print(f"machine: {machine()}")
    print(
        "reference unit: "
        + ", ".join(f"{1e6 * u:.1f}" for u in units)
        + " µs CPU (best of 7 rounds each)"
    )


if __name__ == "__main__":
    main()
