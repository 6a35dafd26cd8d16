"""What a process measures as it runs, for the histograms the views cannot give.

The views hold what every obligation went through (so record-to-delivery latency is read
from the obligation index); how long this process waited before a retry, or took to
sweep, exists only while it runs. Each is kept as bucket counts, as Prometheus
histograms are: observing is a lock and an addition, reading copies a few numbers.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence

import attrs

LATENCY_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
"""Upper bounds (seconds) of the record-to-delivery histogram."""
WAIT_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
"""Upper bounds (seconds) of the retry and rate-limit wait histogram."""
SWEEP_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60)
"""Upper bounds (seconds) of the sweep duration histogram."""


@attrs.frozen
class Buckets:
    """A histogram as read: cumulative counts per upper bound (the last is +Inf)."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0


class Histogram:
    """Observations counted into fixed buckets; safe from any thread."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect_left(self.bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._total += value

    def read(self) -> Buckets:
        with self._lock:
            counts, total = list(self._counts), self._total
        running, cumulative = 0, []
        for n in counts:
            running += n
            cumulative.append(running)
        return Buckets(self.bounds, tuple(cumulative), total)


class Measures:
    """A process's own histograms: waits before a runtime retry by why (``backoff`` or
    ``rate_limit``: the platform's pacing), waits of the pacer by why (``order``,
    ``rate``, ``pause``: ADR 0065), and recovery sweep durations."""

    WAIT_REASONS = ("backoff", "rate_limit")
    PACING_REASONS = ("order", "rate", "pause")

    def __init__(self) -> None:
        self.waits = {reason: Histogram(WAIT_BUCKETS) for reason in self.WAIT_REASONS}
        self.paced = {reason: Histogram(WAIT_BUCKETS) for reason in self.PACING_REASONS}
        self.sweeps = Histogram(SWEEP_BUCKETS)

    def paced_wait(self, reason: str, seconds: float) -> None:
        self.paced[reason].observe(seconds)

    def waited(self, reason: str, seconds: float) -> None:
        self.waits[reason].observe(seconds)
