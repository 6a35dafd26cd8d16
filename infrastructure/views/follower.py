"""The view follower of a ledger in its store: the SQL views, woken by the store.

The loop is the projections' :class:`~gateway_ledger.projections.follower.Follower`;
this is its wiring for an application kept in SQLite or PostgreSQL: the views by name
(``infrastructure/views/delivery.py``) and what wakes it (``infrastructure/wakeups.py``:
NOTIFY on PostgreSQL, polling on SQLite).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from eventsourcing.application import Application

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.infrastructure.views.delivery import VIEWS
from gateway_ledger.infrastructure.views.sql_view import catch_up_views
from gateway_ledger.infrastructure.wakeups import wakeups_for
from gateway_ledger.projections.delivery.catalog import PROJECTION_NAMES
from gateway_ledger.projections.follower import Follower, FollowStats, Wakeups
from gateway_ledger.projections.view import DEFAULT_BATCH_SIZE

__all__ = ["FollowStats", "ViewFollower"]

log = logging.getLogger("gateway_ledger.projections")


class ViewFollower(Follower):
    """Applies new events to the ledger's views as they land.

    ``run()`` follows in the calling thread until ``stop()``; ``start()`` runs it in a
    daemon thread. ``interval`` defaults to 5 s on PostgreSQL (NOTIFY wakes it sooner)
    and 0.5 s on SQLite.
    """

    def __init__(
        self,
        app: Application[Any],
        names: Sequence[str] = PROJECTION_NAMES,
        *,
        interval: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        wakeups: Wakeups | None = None,
    ) -> None:
        views = []
        for name in names:
            make = VIEWS.get(name)
            if make is None:
                known = ", ".join(PROJECTION_NAMES)
                raise InvalidInput(f"no projection named {name!r} (known: {known})")
            views.append(make(app))
        self.sql_views = views
        super().__init__(
            views,
            wakeups or wakeups_for(app),
            interval=interval,
            batch_size=batch_size,
        )

    def catch_up_together(self) -> dict[str, int] | None:
        """The views read and decode each batch once between them (``runner.py``)."""
        try:
            counts = catch_up_views(self.sql_views, batch_size=self.batch_size)
        except Exception as e:
            log.info("view follower: catching the views up together failed (%s)", type(e).__name__)
            return None
        return {view.name: count for view, count in zip(self.sql_views, counts, strict=True)}
