"""What a simulated platform allows, and what it does to a gateway that sends beyond it.

A simulated platform declares its limits (``RateLimits``, ADR 0065) to the gateway, as a
real adapter does, and enforces them at the very start of ``send``: each hand-off is
checked against every hand-off the platform took in its journal, from any gateway process
of the run, in one write transaction (so the check is cross-process, as the real
platform's counter is). A hand-off beyond a limit is a *violation*: recorded, and answered
429 with a ``retry_after`` and the scope it concerns (the chat, or the whole bot). A
platform with a ban rule (Telegram's flood control) bans the bot after repeated
violations: while a ban lasts every send is refused (429, scope ``bot``), and the ban is
recorded. The report counts both; with pacing they must be 0.

Limits are "at most ``sends`` in any window of ``per`` seconds", the strict reading: the
platform looks on both sides of a hand-off, so a process whose check commits late is
judged against the hand-offs other processes made just after it.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from gateway_ledger.application.delivery.rate_limits import (
    BOT,
    CHAT,
    PRESETS,
    Limit,
    RateLimits,
    telegram_group,
)
from gateway_ledger.domain.values import DeliveryTarget

LIMITS_SCHEMA = """
CREATE TABLE IF NOT EXISTS handoffs (
    chat TEXT NOT NULL,
    at REAL NOT NULL,
    sender_pid INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS handoffs_at ON handoffs (at);
CREATE INDEX IF NOT EXISTS handoffs_chat ON handoffs (chat, at);
CREATE TABLE IF NOT EXISTS violations (
    chat TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    sender_pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bans (
    at REAL NOT NULL,
    until REAL NOT NULL
);
"""
"""``handoffs``: every send the platform took within its limits (whatever it answered
after). ``violations``: sends refused for a limit (``kind``: ``chat``, ``group``, ``bot``)
or during a ban (``banned``). ``bans``: the bot banned from ``at`` to ``until``."""

RATE_SCALE = 0.1
"""Simulated platforms' windows are 1/10 of the real ones: Telegram's one message a
second per chat becomes one per 100 ms, its 30 a second per bot 300 a second. Faster
than the real platforms (runs stay short) yet slower than an unpaced gateway sends (a
reply's parts follow each other within milliseconds, a backlog goes at once), so without
pacing a run violates them and with it the pacer really works. WhatsApp's 80 a second
(800 here) stays above what a simulation sends: the platform far below its limit."""

EDGE_TOLERANCE = 0.001
"""Seconds at a window's edge the platform lets pass: the gateway's pacer reads the clock
a few microseconds before the platform does, in the same process with no await between;
a hand-off exactly ``per`` after the one it waited for must not look early by those."""

KINDS = ("chat", "group", "bot", "banned")


def sim_limits(platform: str) -> dict[str, list[float]]:
    """A simulated platform's limits: its real preset, every window ``RATE_SCALE`` long."""
    return limits_to_dict(PRESETS[platform].scaled(RATE_SCALE))


def limits_to_dict(limits: RateLimits) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name in ("per_bot", "per_chat", "per_group"):
        limit: Limit | None = getattr(limits, name)
        if limit is not None:
            out[name] = [limit.sends, limit.per]
    return out


def limits_from_dict(data: Mapping[str, Sequence[float]]) -> RateLimits:
    """``{"per_chat": [1, 0.05], ...}`` as ``RateLimits``; groups are Telegram's (negative
    chat ids) where ``per_group`` is given, the only platform with a group limit."""

    def limit(name: str) -> Limit | None:
        pair = data.get(name)
        return None if pair is None else Limit(int(pair[0]), float(pair[1]))

    per_group = limit("per_group")
    if per_group is None:
        return RateLimits(per_bot=limit("per_bot"), per_chat=limit("per_chat"))
    return RateLimits(
        per_bot=limit("per_bot"),
        per_chat=limit("per_chat"),
        per_group=per_group,
        is_group=telegram_group,
    )


@attrs.frozen
class BanRule:
    """After ``after`` violations within ``window`` seconds the bot is banned for
    ``seconds`` (Telegram's flood control, scaled). Sends refused during a ban are
    violations too, but do not start or lengthen a ban."""

    after: int
    window: float
    seconds: float


@attrs.frozen
class Refusal:
    """A 429: why, for how long, and for which scope (``chat`` or ``bot``)."""

    kind: str
    retry_after: float
    scope: str


def chat_key(target: DeliveryTarget) -> str:
    """The platform's chat: the chat id and its thread."""
    return target.chat_id if target.thread_id is None else f"{target.chat_id}#{target.thread_id}"


def exceeds(others: Sequence[float], at: float, limit: Limit) -> bool:
    """Would a hand-off at ``at`` put more than ``limit.sends`` hand-offs in some window of
    ``limit.per`` seconds, with ``others`` (sorted) already taken? Both sides are looked
    at: a hand-off committed late is judged against those made just after it."""
    span = limit.per - EDGE_TOLERANCE
    times = sorted([*others, at])
    first = bisect_left(times, at - span)
    # every window holding ``at`` starts at one of the hand-offs in (at - span, at]
    for i in range(first, len(times)):
        start = times[i]
        if start > at:
            break
        if start <= at - span:
            continue
        end = bisect_left(times, start + span)
        if end - i > limit.sends:
            return True
    return False


def check_handoff(
    conn: sqlite3.Connection,
    limits: RateLimits,
    ban: BanRule | None,
    target: DeliveryTarget,
    at: float,
    pid: int,
) -> Refusal | None:
    """Judge one hand-off at ``at`` (one write transaction): None when the platform takes
    it (recorded in ``handoffs``), else the refusal (recorded in ``violations``)."""
    chat = chat_key(target)
    conn.execute("BEGIN IMMEDIATE")
    try:
        refusal = _judge(conn, limits, ban, target, chat, at)
        if refusal is None:
            conn.execute(
                "INSERT INTO handoffs (chat, at, sender_pid) VALUES (?, ?, ?)", (chat, at, pid)
            )
        else:
            conn.execute(
                "INSERT INTO violations (chat, at, kind, sender_pid) VALUES (?, ?, ?, ?)",
                (chat, at, refusal.kind, pid),
            )
            if ban is not None and refusal.kind != "banned":
                _maybe_ban(conn, ban, at)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return refusal


def _judge(
    conn: sqlite3.Connection,
    limits: RateLimits,
    ban: BanRule | None,
    target: DeliveryTarget,
    chat: str,
    at: float,
) -> Refusal | None:
    if ban is not None:
        row = conn.execute(
            "SELECT MAX(until) FROM bans WHERE at <= ? AND until > ?", (at, at)
        ).fetchone()
        if row[0] is not None:
            return Refusal("banned", float(row[0]) - at, BOT)
    chat_limit = limits.chat_limit(target)
    if chat_limit is not None:
        others = _times(
            conn,
            "SELECT at FROM handoffs WHERE chat = ? AND at > ? AND at < ?",
            chat,
            at,
            chat_limit,
        )
        if exceeds(others, at, chat_limit):
            kind = "group" if chat_limit is limits.per_group else "chat"
            return Refusal(kind, chat_limit.per, CHAT)
    if limits.per_bot is not None:
        others = _times(
            conn, "SELECT at FROM handoffs WHERE at > ? AND at < ?", None, at, limits.per_bot
        )
        if exceeds(others, at, limits.per_bot):
            return Refusal("bot", limits.per_bot.per, BOT)
    return None


def _times(
    conn: sqlite3.Connection, sql: str, chat: str | None, at: float, limit: Limit
) -> list[float]:
    bounds = (at - limit.per, at + limit.per)
    params: tuple[Any, ...] = bounds if chat is None else (chat, *bounds)
    return sorted(float(r[0]) for r in conn.execute(sql, params))


def _maybe_ban(conn: sqlite3.Connection, ban: BanRule, at: float) -> None:
    if conn.execute("SELECT 1 FROM bans WHERE until > ? LIMIT 1", (at,)).fetchone():
        return  # a ban in force (or one that began after this hand-off) is not renewed
    recent = conn.execute(
        "SELECT COUNT(*) FROM violations WHERE kind != 'banned' AND at > ? AND at <= ?",
        (at - ban.window, at),
    ).fetchone()[0]
    if recent >= ban.after:
        conn.execute("INSERT INTO bans (at, until) VALUES (?, ?)", (at, at + ban.seconds))


@attrs.frozen
class Enforcement:
    """What one platform's journal says about its limits after a run."""

    handoffs: int = 0
    violations: dict[str, int] = attrs.field(factory=dict)
    bans: int = 0
    banned_seconds: float = 0.0

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())


def read_enforcement(path: str | Path) -> Enforcement:
    if not Path(path).exists():
        return Enforcement()
    conn = sqlite3.connect(str(path), timeout=30)
    try:
        conn.executescript(LIMITS_SCHEMA)
        handoffs = int(conn.execute("SELECT COUNT(*) FROM handoffs").fetchone()[0])
        violations = {
            str(kind): int(n)
            for kind, n in conn.execute(
                "SELECT kind, COUNT(*) FROM violations GROUP BY kind ORDER BY kind"
            )
        }
        bans, seconds = conn.execute("SELECT COUNT(*), SUM(until - at) FROM bans").fetchone()
    finally:
        conn.close()
    return Enforcement(handoffs, violations, int(bans), round(float(seconds or 0.0), 3))
