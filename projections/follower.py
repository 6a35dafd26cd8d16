"""Keep the views current as events land, instead of at each read.

Views are caught up on demand: before a sweep, before an operator's listing. That is
always correct, but the reader pays for every event since the last catch-up. A follower
runs the same catch-up as events arrive, so those reads find little or nothing left to
apply. This matters most with several gateways on one PostgreSQL database, where each
host's sweep would otherwise replay what the others wrote.

The follower adds no second way of applying events: it calls each view's own
``catch_up`` (one transaction per batch, with the tracking position; several processes
may do it at once). What wakes it is a port (:class:`Wakeups`: a NOTIFY on PostgreSQL,
the clock on SQLite, in ``infrastructure/wakeups.py``), and it catches up after every
wait, woken or not. A failed catch-up is logged and counted, and the next one tries again
from the view's own position: nothing is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, Self

import attrs

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.projections.view import DEFAULT_BATCH_SIZE, MaterializedView

log = logging.getLogger("gateway_ledger.projections")


class Wakeups(Protocol):
    """What tells a follower that the log may have grown."""

    default_interval: float
    """Seconds between catch-ups when nothing wakes the follower sooner."""

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Block up to ``timeout`` seconds; True if news arrived, False otherwise."""

    def close(self) -> None: ...


@attrs.define
class FollowStats:
    catch_ups: int = 0
    notified: int = 0
    applied: dict[str, int] = attrs.field(factory=dict)
    errors: int = 0
    position: int = 0
    """The lowest position over the followed views after the last catch-up."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


Applied = Callable[[dict[str, int], "FollowStats"], None]
"""Called after each catch-up that applied something: events per view, running stats."""


class Follower:
    """Applies new events to views as they land.

    ``run()`` follows in the calling thread until ``stop()``; ``start()`` runs it in a
    daemon thread. ``interval`` defaults to the wake-ups' own (long where the store
    announces commits, short where the follower must poll).
    """

    def __init__(
        self,
        views: Sequence[MaterializedView],
        wakeups: Wakeups,
        *,
        interval: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.views = list(views)
        self.wakeups = wakeups
        self.interval = wakeups.default_interval if interval is None else interval
        if self.interval <= 0:
            raise InvalidInput(f"interval must be positive, not {self.interval}")
        self.batch_size = batch_size
        self.stats = FollowStats(applied={view.name: 0 for view in self.views})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def catch_up(self) -> dict[str, int]:
        """One catch-up of every followed view; a failing view is logged and counted."""
        together = self.catch_up_together()
        applied: dict[str, int] = {}
        positions = []
        for view in self.views:
            try:
                if together is None:
                    applied[view.name] = view.catch_up(batch_size=self.batch_size)
                else:
                    applied[view.name] = together[view.name]
                positions.append(view.position())
            except Exception as e:
                self.stats.errors += 1
                log.warning("view follower: %s catch-up failed: %s", view.name, type(e).__name__)
        self.stats.catch_ups += 1
        for name, count in applied.items():
            self.stats.applied[name] += count
        if positions:
            self.stats.position = min(positions)
        return applied

    def catch_up_together(self) -> dict[str, int] | None:
        """Every view caught up at once, sharing what they can (by view name); None: not
        offered here, or it failed, and each view is caught up on its own."""
        return None

    def run(
        self, *, duration: float | None = None, on_applied: Applied | None = None
    ) -> FollowStats:
        """Follow until :meth:`stop` (or for ``duration`` seconds); returns the stats."""
        ends = None if duration is None else time.monotonic() + duration
        try:
            while not self._stop.is_set():
                applied = self.catch_up()
                if on_applied is not None and any(applied.values()):
                    on_applied(applied, self.stats)
                wait = self.interval
                if ends is not None:
                    wait = min(wait, ends - time.monotonic())
                    if wait <= 0:
                        break
                if self.wakeups.wait(wait, self._stop):
                    self.stats.notified += 1
        finally:
            self.wakeups.close()
        return self.stats

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, name="gateway-ledger-view-follower", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the follower to stop; waits for its thread if it has one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
