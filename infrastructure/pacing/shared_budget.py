"""The bot budgets and pauses the gateways of one store share (ADR 0060).

Two small tables beside the events, on both stores through :class:`SqlDialect`:

- ``pacing_members``: one row per (gateway, platform) it sends through, renewed every
  period with an expiry three periods ahead. Each gateway keeps ``1/n`` of a platform's
  bot limit, ``n`` the rows not expired: a killed gateway's share comes back when its row
  expires.
- ``pacing_pauses``: a bot-wide ``retry_after`` one gateway was told, until when; the
  others read it at their next renewal.

Nothing here is read or written per send: a gateway renews once a period (one short
write transaction and one read), so what sharing costs is per gateway and second, not per
reply. Rows hold the gateway's identity (host, pid) and platform names, no personal data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect, dialect_for
from gateway_ledger.infrastructure.ownership.leases import owner_key

MEMBERS = "pacing_members"
PAUSES = "pacing_pauses"


class SharedBudget:
    """SQL for the shared pacing rows. ``clock``: seconds since the epoch (the host's;
    gateways on several hosts need clocks kept in step, as leases do)."""

    def __init__(self, dialect: SqlDialect, clock: Callable[[], float] = time.time) -> None:
        self.dialect = dialect
        self.clock = clock
        self.members = dialect.table(MEMBERS)
        self.pauses_table = dialect.table(PAUSES)
        self._ready = False

    @classmethod
    def of(cls, app: Any) -> SharedBudget:
        return cls(dialect_for(app.recorder))

    def ensure_tables(self) -> None:
        if self._ready:
            return
        self.dialect.create_tables(
            f"CREATE TABLE IF NOT EXISTS {self.members} (member TEXT NOT NULL, "
            "platform TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL, "
            "PRIMARY KEY (member, platform))",
            f"CREATE TABLE IF NOT EXISTS {self.pauses_table} ("
            "platform TEXT PRIMARY KEY, until DOUBLE PRECISION NOT NULL)",
        )
        self._ready = True

    def renew(
        self, owner: OwnerIdentity, platforms: Sequence[str], ttl: float
    ) -> tuple[dict[str, int], dict[str, float]]:
        """Keep this gateway's share of each platform for ``ttl`` seconds more; returns
        the gateways sharing each platform (this one included) and the bot pauses in
        force (platform: seconds left)."""
        self.ensure_tables()
        sql, me, now = self.dialect.sql, owner_key(owner), self.clock()
        with self.dialect.write_transaction() as c:
            c.execute(sql(f"DELETE FROM {self.members} WHERE expires_at < ?"), (now,))
            for platform in platforms:
                c.execute(
                    sql(
                        f"INSERT INTO {self.members} (member, platform, expires_at) "
                        "VALUES (?, ?, ?) ON CONFLICT (member, platform) DO UPDATE SET "
                        "expires_at = excluded.expires_at"
                    ),
                    (me, platform, now + ttl),
                )
            shares = self._shares(c, platforms)
            pauses = self._pauses(c, now)
        return shares, pauses

    def _shares(self, c: Cursor, platforms: Sequence[str]) -> dict[str, int]:
        c.execute(f"SELECT platform, COUNT(*) AS n FROM {self.members} GROUP BY platform")
        counted = {str(row["platform"]): int(row["n"]) for row in c.fetchall()}
        return {p: max(1, counted.get(p, 1)) for p in platforms}

    def _pauses(self, c: Cursor, now: float) -> dict[str, float]:
        c.execute(
            self.dialect.sql(f"SELECT platform, until FROM {self.pauses_table} WHERE until > ?"),
            (now,),
        )
        return {str(row["platform"]): float(row["until"]) - now for row in c.fetchall()}

    def pause(self, platform: str, seconds: float) -> None:
        """Tell the store's other gateways the platform paused the whole bot."""
        self.ensure_tables()
        sql, until = self.dialect.sql, self.clock() + max(0.0, seconds)
        with self.dialect.write_transaction() as c:
            c.execute(
                sql(
                    f"INSERT INTO {self.pauses_table} (platform, until) VALUES (?, ?) "
                    "ON CONFLICT (platform) DO UPDATE SET until = "
                    f"CASE WHEN excluded.until > {self.pauses_table}.until "
                    f"THEN excluded.until ELSE {self.pauses_table}.until END"
                ),
                (platform, until),
            )

    def standing(self) -> tuple[dict[str, float], dict[str, int]]:
        """For operators, read only, in one read at one instant: the bot pauses in force
        (platform: seconds left) and the gateways sharing each platform's bot (rows not
        expired); nothing when no gateway has shared a budget on this store yet."""
        if not self._exists():
            return {}, {}
        with self.dialect.read_cursor() as c:
            now = self.clock()
            pauses = self._pauses(c, now)
            c.execute(
                self.dialect.sql(
                    f"SELECT platform, COUNT(*) AS n FROM {self.members} "
                    "WHERE expires_at >= ? GROUP BY platform"
                ),
                (now,),
            )
            sharing = {str(row["platform"]): int(row["n"]) for row in c.fetchall()}
        return pauses, sharing

    def _exists(self) -> bool:
        try:
            with self.dialect.read_cursor() as c:
                c.execute(f"SELECT COUNT(*) AS n FROM {self.pauses_table} WHERE 1 = 0")
                c.fetchall()
            return True
        except Exception:
            return False

    def leave(self, owner: OwnerIdentity) -> None:
        """A clean close: the others take this gateway's share back at once."""
        self.ensure_tables()
        with self.dialect.write_transaction() as c:
            c.execute(
                self.dialect.sql(f"DELETE FROM {self.members} WHERE member = ?"),
                (owner_key(owner),),
            )
