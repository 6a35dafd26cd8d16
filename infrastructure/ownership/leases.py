"""Leases: "this gateway process is alive", renewed by a heartbeat, in the store itself.

A lease is one row per running ledger owner in ``gateway_ledger_leases``, in the same
database as the events (on PostgreSQL in the URL's schema), NOT in the obligation streams:
a heartbeat every few seconds is not a fact about any reply, and appending it as events
would grow the log forever and wake every projection (ADR 0010).

Expiry is judged on ONE clock: PostgreSQL's ``now()`` for both writing ``expires_at`` and
reading it back, so host clocks never meet. On SQLite (one host by construction) the host
clock is used. A test may inject a clock. ``clock_skew`` is still allowed for on top (dead
only when ``now > expires_at + skew``): it covers an injected or host clock, and costs
nothing but detection latency.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect, dialect_for

log = logging.getLogger("gateway_ledger.leases")

LEASE_TABLE = "gateway_ledger_leases"
LEASES_ENV = "GATEWAY_LEDGER_LEASES"  # on | off (default: on for PostgreSQL)
TTL_ENV = "GATEWAY_LEDGER_LEASE_TTL"
RENEW_ENV = "GATEWAY_LEDGER_LEASE_RENEW"
SKEW_ENV = "GATEWAY_LEDGER_CLOCK_SKEW"
PRUNE_AFTER = 7 * 24 * 3600.0
"""Lease rows expired for longer than this are deleted when a lease is acquired."""


def _positive(name: str) -> Callable[[Any, Any, float], None]:
    def check(_: Any, __: Any, value: float) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise InvalidInput(f"{name} must be a positive number of seconds")

    return check


@attrs.frozen
class LeaseSettings:
    """How long a lease lives, how often it is renewed, how much clock skew is tolerated.

    ``enabled=None`` means: on for PostgreSQL (several hosts), off for SQLite (one host,
    where /proc already proves liveness).
    """

    ttl: float = attrs.field(default=15.0, validator=_positive("lease ttl"))
    renew_every: float = attrs.field(default=5.0, validator=_positive("lease renewal period"))
    clock_skew: float = 2.0
    enabled: bool | None = None

    def __attrs_post_init__(self) -> None:
        if self.renew_every >= self.ttl:
            raise InvalidInput("a lease must be renewed well inside its ttl (renew_every < ttl)")
        skew = self.clock_skew
        if not isinstance(skew, int | float) or isinstance(skew, bool) or skew < 0:
            raise InvalidInput("clock_skew must be a non-negative number of seconds")

    @property
    def dead_after(self) -> float:
        """Worst-case seconds from a holder's last renewal until others may judge it dead."""
        return self.ttl + self.clock_skew

    def wanted(self, is_postgres: bool) -> bool:
        return is_postgres if self.enabled is None else self.enabled

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> LeaseSettings:
        def number(key: str, default: float) -> float:
            raw = env.get(key, "").strip()
            try:
                return float(raw) if raw else default
            except ValueError:
                raise InvalidInput(f"{key}={raw!r} is not a number of seconds") from None

        base = cls()
        switch = env.get(LEASES_ENV, "").strip().lower()
        enabled = None if not switch else switch in ("1", "on", "y", "yes", "true")
        ttl = number(TTL_ENV, base.ttl)
        renew = number(RENEW_ENV, min(base.renew_every, ttl / 3))
        return cls(
            ttl=ttl,
            renew_every=renew,
            clock_skew=number(SKEW_ENV, base.clock_skew),
            enabled=enabled,
        )


IDLE_IN_TRANSACTION_ENV = "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT"
"""The library's setting (whole seconds) for ``idle_in_transaction_session_timeout``."""
IDLE_IN_TRANSACTION_DEFAULT = 5
"""The library's own default, kept as the ceiling."""


def idle_transaction_limit(settings: LeaseSettings) -> int:
    """Seconds PostgreSQL lets a session sit idle inside a transaction (ADR 0032).

    A gateway stopped (SIGSTOP, a frozen VM) inside a transaction keeps its row and table
    locks, and every writer of the schema waits behind it, the sweep that should claim its
    work included. The server ends such a transaction (rolled back, the session closed)
    once it has been idle this long: half the lease ttl, so the locks are gone before
    others may judge the holder dead, and never more than the library's default.
    """
    return max(1, min(IDLE_IN_TRANSACTION_DEFAULT, int(settings.ttl / 2)))


def with_idle_transaction_limit(
    env: Mapping[str, str], settings: LeaseSettings, outer: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """``env`` with :func:`idle_transaction_limit` unless the operator set the limit."""
    if IDLE_IN_TRANSACTION_ENV in env or IDLE_IN_TRANSACTION_ENV in outer:
        return dict(env)
    return {**env, IDLE_IN_TRANSACTION_ENV: str(idle_transaction_limit(settings))}


def owner_key(owner: OwnerIdentity) -> str:
    """The lease row's key: every field of the identity, so a reused pid is another owner."""
    return json.dumps(
        [owner.installation_id, owner.host, owner.boot_id, owner.pid, owner.start_time],
        separators=(",", ":"),
    )


@attrs.frozen
class Lease:
    owner: OwnerIdentity
    acquired_at: float
    renewed_at: float
    expires_at: float


@attrs.frozen
class LeaseLookup:
    """One owner's lease as seen now, on the store's clock (``expires_at`` None: no lease)."""

    expires_at: float | None
    now: float

    def expired(self, skew: float) -> bool:
        return self.expires_at is not None and self.now > self.expires_at + skew


class LeaseTable:
    """SQL for the lease rows; works on both stores through :class:`SqlDialect`.

    ``clock`` (seconds since the epoch) replaces the store's clock; None means PostgreSQL's
    ``now()`` there, the host clock on SQLite.
    """

    def __init__(self, dialect: SqlDialect, clock: Callable[[], float] | None = None) -> None:
        self.dialect = dialect
        self.clock = clock
        self.table = dialect.table(LEASE_TABLE)
        self._ready = False

    @classmethod
    def of(cls, app: Any, clock: Callable[[], float] | None = None) -> LeaseTable:
        return cls(dialect_for(app.recorder), clock)

    def ensure_table(self) -> None:
        if self._ready:
            return
        self.dialect.create_tables(
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            "owner_key TEXT PRIMARY KEY, installation_id TEXT NOT NULL, "
            "host TEXT NOT NULL, boot_id TEXT NOT NULL, pid BIGINT NOT NULL, "
            "start_time BIGINT, acquired_at DOUBLE PRECISION NOT NULL, "
            "renewed_at DOUBLE PRECISION NOT NULL, "
            "expires_at DOUBLE PRECISION NOT NULL)"
        )
        self._ready = True

    def _now(self, c: Cursor) -> float:
        if self.clock is not None:
            return float(self.clock())
        if self.dialect.name == "postgres":
            c.execute("SELECT EXTRACT(EPOCH FROM now())::float8 AS now")
            return float(c.fetchone()["now"])
        return time.time()

    def now(self) -> float:
        """The clock leases are judged by."""
        with self.dialect.read_cursor() as c:
            return self._now(c)

    def renew(self, owner: OwnerIdentity, ttl: float) -> float:
        """Acquire or extend ``owner``'s lease to now + ttl; returns the new expiry."""
        self.ensure_table()
        sql = self.dialect.sql
        with self.dialect.write_transaction() as c:
            now = self._now(c)
            c.execute(
                sql(
                    f"INSERT INTO {self.table} (owner_key, installation_id, host, boot_id, pid, "
                    "start_time, acquired_at, renewed_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner_key) DO UPDATE SET "
                    "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at"
                ),
                (
                    owner_key(owner),
                    owner.installation_id,
                    owner.host,
                    owner.boot_id,
                    owner.pid,
                    owner.start_time,
                    now,
                    now,
                    now + ttl,
                ),
            )
        return now + ttl

    def release(self, owner: OwnerIdentity) -> None:
        """A clean close: others may take this owner's unresolved work at once."""
        self.ensure_table()
        with self.dialect.write_transaction() as c:
            c.execute(
                self.dialect.sql(f"DELETE FROM {self.table} WHERE owner_key = ?"),
                (owner_key(owner),),
            )

    def prune(self, expired_for: float = PRUNE_AFTER) -> int:
        """Delete rows of owners long dead (their leases only grow the table)."""
        self.ensure_table()
        with self.dialect.write_transaction() as c:
            now = self._now(c)
            c.execute(
                self.dialect.sql(f"DELETE FROM {self.table} WHERE expires_at < ?"),
                (now - expired_for,),
            )
            return int(getattr(c, "rowcount", 0) or 0)

    def lookup(self, owner: OwnerIdentity) -> LeaseLookup:
        self.ensure_table()
        with self.dialect.read_cursor() as c:
            now = self._now(c)
            c.execute(
                self.dialect.sql(f"SELECT expires_at FROM {self.table} WHERE owner_key = ?"),
                (owner_key(owner),),
            )
            row = c.fetchone()
        return LeaseLookup(None if row is None else float(row["expires_at"]), now)

    def leases(self) -> list[Lease]:
        """Every lease row, oldest first (for operators)."""
        self.ensure_table()
        with self.dialect.read_cursor() as c:
            c.execute(
                f"SELECT installation_id, host, boot_id, pid, start_time, acquired_at, "
                f"renewed_at, expires_at FROM {self.table} ORDER BY acquired_at"
            )
            rows = c.fetchall()
        return [
            Lease(
                owner=OwnerIdentity(
                    host=r["host"],
                    boot_id=r["boot_id"],
                    pid=int(r["pid"]),
                    start_time=None if r["start_time"] is None else int(r["start_time"]),
                    installation_id=r["installation_id"],
                ),
                acquired_at=float(r["acquired_at"]),
                renewed_at=float(r["renewed_at"]),
                expires_at=float(r["expires_at"]),
            )
            for r in rows
        ]


class Heartbeat:
    """Holds one owner's lease: acquired on start, renewed by a daemon thread, released on stop.

    A failed renewal is logged and counted, never raised: the store may be back before the
    lease runs out, and if it is not, fencing (not this thread) keeps the work safe.

    The holder's own view of its lease is a LOCAL deadline on ``monotonic`` (ADR 0032): the
    clock read just before a renewal that succeeded, plus the ttl. The store's expiry is
    later than that (its ``now()`` is read after the request left), so while
    :meth:`holds` is true nobody may have judged this owner dead. The monotonic clock runs
    on while the process is stopped (SIGSTOP), so a paused holder sees at once, on
    resuming, that it cannot prove its lease, even before this thread has renewed. (A
    suspended VM's monotonic clock may not run on: neither this deadline nor the lapse
    count sees that pause; only the fence at the next write does.) A renewal that lands
    after the local deadline passed counts a ``lapse``: the lease was renewed, but others
    may have claimed work in the gap, so whoever proved ownership before it must prove it
    again.
    """

    def __init__(
        self,
        table: LeaseTable,
        owner: OwnerIdentity,
        settings: LeaseSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.owner = owner
        self.settings = settings
        self.renewals = 0
        self.failures = 0
        self.lapses = 0
        """Renewals that landed after the local deadline (or the first acquisition)."""
        self.expires_at: float | None = None
        self.monotonic = monotonic
        self._held_until = float("-inf")
        self._renewing = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, margin: float = 0.0) -> bool:
        """True while the lease is provably valid for ``margin`` more seconds (one clock read)."""
        return self.monotonic() + margin < self._held_until

    def renew(self) -> None:
        """Renew once now and move the local deadline; raises what the store raised."""
        with self._renewing:
            started = self.monotonic()
            self.expires_at = self.table.renew(self.owner, self.settings.ttl)
            if self.monotonic() >= self._held_until:
                self.lapses += 1  # landed after the local deadline: continuity not proven
            self._held_until = max(self._held_until, started + self.settings.ttl)

    def start(self) -> Heartbeat:
        """Acquire the lease now (raises if the store refuses), then renew in the background."""
        self.renew()
        try:
            self.table.prune()
        except Exception as e:
            log.debug("lease prune failed: %s", type(e).__name__)
        log.info(
            "lease acquired owner=%s ttl=%.1fs renew=%.1fs",
            self.owner.describe(),
            self.settings.ttl,
            self.settings.renew_every,
        )
        self._thread = threading.Thread(
            target=self._run, name=f"gateway-ledger-lease-{self.owner.pid}", daemon=True
        )
        self._thread.start()
        # Stop (and release) before the interpreter freezes daemon threads: a frozen renewal
        # thread may hold the stop event's lock, and a later stop() would wait forever.
        atexit.register(self._at_exit)
        return self

    def _at_exit(self) -> None:
        self.stop(release=True)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.renew_every):
            self.beat()

    def beat(self) -> bool:
        started = time.perf_counter()
        try:
            self.renew()
        except Exception as e:
            self.failures += 1
            log.warning("lease renewal failed owner=%s: %s", self.owner.pid, type(e).__name__)
            return False
        self.renewals += 1
        elapsed = time.perf_counter() - started
        if elapsed > self.settings.renew_every:
            log.warning("lease renewal took %.1fs (ttl %.1fs)", elapsed, self.settings.ttl)
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def signal_stop(self) -> None:
        """Stop renewing soon, without waiting or releasing (safe from any thread)."""
        self._stop.set()

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; ``release`` deletes the row so others need not wait for expiry."""
        if sys.is_finalizing():
            return  # too late to talk to the store; the lease simply expires
        atexit.unregister(self._at_exit)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.renew_every + 5)
            self._thread = None
        if release:
            try:
                self.table.release(self.owner)
                log.info("lease released owner=%s", self.owner.describe())
            except Exception as e:
                log.warning("lease release failed (it will expire): %s", type(e).__name__)
