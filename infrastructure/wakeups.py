"""What wakes a view follower: a NOTIFY on PostgreSQL, the clock on SQLite.

The library NOTIFYs its events table's channel inside every insert transaction, so a
listener hears of new events when they commit. SQLite has no push, so there the
follower polls. A wake-up only says "look now". The follower's catch-up pulls the log
from the view's own position, so a lost, merged or spurious notification costs
latency, never an event. A new LISTEN (the first, or after a dropped connection) wakes
the follower at once, because commits made before it notified nobody; the catch-up that
follows every wait, woken or not, picks them up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from gateway_ledger.projections.follower import Wakeups

log = logging.getLogger("gateway_ledger.projections")

SLICE = 0.25
"""Longest single wait, so that a stop request is seen within this many seconds."""
BACKOFF = 0.1
"""Seconds before the first reconnection attempt; doubled up to the follower's interval."""


class Polling:
    """SQLite: nothing announces a commit, so the follower looks every ``timeout``."""

    default_interval = 0.5

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        stop.wait(timeout)
        return False

    def close(self) -> None:
        pass


class PostgresNotifications:
    """LISTEN on the events table's channel, on a connection of its own.

    Used by one thread only (the follower's). On a connection error it logs, backs off
    (0.1 s, doubling up to the timeout) and reconnects on the next wait.
    """

    default_interval = 5.0
    """A safety net only: NOTIFY is the mechanism."""

    def __init__(self, env: Mapping[str, str], channel: str) -> None:
        from gateway_ledger.infrastructure.eventstore.postgres import environment_params

        self.params = environment_params(env)
        self.channel = channel
        self.reconnects = 0
        self._backoff = 0.0
        self._conn: Any = None

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """A new (or renewed) LISTEN returns True at once: commits made before it sent
        their NOTIFY to nobody, so the caller must look now; every later one wakes it."""
        import psycopg

        deadline = time.monotonic() + timeout
        try:
            if self._conn is None:
                self._listen()
                self._backoff = 0.0
                return True
            conn = self._conn
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # Consume each generator whole: a suspended one holds the connection's lock.
                if list(conn.notifies(timeout=min(SLICE, left), stop_after=1)):
                    list(conn.notifies(timeout=0.0))  # and what else is there: one catch-up
                    return True
            return False
        except psycopg.Error as e:
            log.warning(
                "view follower: LISTEN connection lost (%s); reconnecting", type(e).__name__
            )
            self._drop()
            self.reconnects += 1
            # Retry soon, then less often while the server stays away; the caller's
            # catch-up after this wait may fail too, and is counted there.
            self._backoff = min(timeout, max(BACKOFF, self._backoff * 2))
            stop.wait(self._backoff)
            return False

    def _listen(self) -> None:
        from psycopg import sql

        from gateway_ledger.infrastructure.eventstore.postgres import connect

        conn = connect(self.params)
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing left to release
                log.debug("view follower: closing a broken connection failed", exc_info=True)

    def close(self) -> None:
        self._drop()


def wakeups_for(app: Any) -> Wakeups:
    """NOTIFY where the store sends it (PostgreSQL), polling elsewhere."""
    channel = getattr(app.recorder, "channel_name", None)
    if app.env.get("PERSISTENCE_MODULE") == "eventsourcing.postgres" and channel:
        return PostgresNotifications(app.env, str(channel))
    return Polling()
