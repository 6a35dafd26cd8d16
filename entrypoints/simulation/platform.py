"""A simulated chat platform: a PlatformAdapter whose "server" is a journal in SQLite.

A message has *arrived* the moment its journal row commits, in the platform's own file,
independent of the gateway process: when the gateway is killed after that commit but
before it hears back, the user has the message and the ledger does not know. The report
counts duplicates from these journals, as the users would see them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from gateway_ledger.application.delivery.ports import AdapterBase, SendResult
from gateway_ledger.domain.values import DeliveryTarget, ErrorClass, MediaItem

JOURNAL_SCHEMA = """
CREATE TABLE IF NOT EXISTS received (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    reply_to TEXT,
    content TEXT NOT NULL,
    media_uri TEXT,
    idempotency_key TEXT UNIQUE,
    sender_pid INTEGER NOT NULL,
    at REAL NOT NULL,
    sent_at REAL
);
CREATE TABLE IF NOT EXISTS deduplicated (
    idempotency_key TEXT NOT NULL,
    at REAL NOT NULL
);
"""


@attrs.frozen
class PlatformBehaviour:
    """How unreliable one simulated platform is. Rates are per send."""

    latency: tuple[float, float] = (0.001, 0.005)
    rejected: float = 0.0
    rate_limited: float = 0.0
    retry_after: tuple[float, float] = (0.05, 0.3)
    ambiguous_before: float = 0.0  # timeout before the request left: did not arrive
    ambiguous_after: float = 0.0  # timeout after it arrived: the user has it
    dead_chats: frozenset[str] = frozenset()
    idempotent: bool = False
    hold_after_arrival: float = 0.0  # widen the window where a kill loses the confirmation

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlatformBehaviour:
        d = dict(data)
        for name in ("latency", "retry_after"):
            if name in d:
                d[name] = tuple(d[name])
        if "dead_chats" in d:
            d["dead_chats"] = frozenset(d["dead_chats"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["dead_chats"] = sorted(self.dead_chats)
        d["latency"] = list(self.latency)
        d["retry_after"] = list(self.retry_after)
        return d


def open_journal(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # survives a killed process, which is the test
    conn.executescript(JOURNAL_SCHEMA)
    return conn


class SimulatedPlatform(AdapterBase):
    """One platform; safe to use from one event loop. Journal writes run on its own thread."""

    def __init__(
        self,
        platform: str,
        journal: str | Path,
        behaviour: PlatformBehaviour | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.platform = platform
        self.behaviour = behaviour or PlatformBehaviour()
        self.supports_idempotency = self.behaviour.idempotent
        self.journal_path = str(journal)
        self._rng = random.Random(seed)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"platform-{platform}"
        )

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._connection)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_journal(self.journal_path)
        return self._conn

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()

    async def send(
        self,
        target: DeliveryTarget,
        content: str,
        *,
        reply_to: str | None,
        media: Sequence[MediaItem],
        metadata: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> SendResult:
        b, rng = self.behaviour, self._rng
        handed_at = time.time()  # when the gateway handed this message to the platform
        await asyncio.sleep(rng.uniform(*b.latency))
        if target.chat_id in b.dead_chats:
            return SendResult.failed(ErrorClass.DEAD_TARGET, "403 bot was blocked by the user")
        roll = rng.random()
        if roll < b.rejected:
            return SendResult.failed(ErrorClass.REJECTED, "400 bad request")
        roll -= b.rejected
        if roll < b.rate_limited:
            return SendResult.failed(
                ErrorClass.RATE_LIMITED, "429 too many requests", rng.uniform(*b.retry_after)
            )
        roll -= b.rate_limited
        if roll < b.ambiguous_before:
            raise TimeoutError("request timed out before it was sent")
        roll -= b.ambiguous_before
        loop = asyncio.get_running_loop()
        message_id = await loop.run_in_executor(
            self._pool,
            self._arrive,
            target,
            content,
            reply_to,
            media[0].uri if media else None,
            idempotency_key if b.idempotent else None,
            handed_at,
        )
        await asyncio.sleep(b.hold_after_arrival or rng.uniform(*b.latency))
        if roll < b.ambiguous_after:
            raise TimeoutError("response lost after the message arrived")
        return SendResult.ok(message_id)

    def _arrive(
        self,
        target: DeliveryTarget,
        content: str,
        reply_to: str | None,
        media_uri: str | None,
        key: str | None,
        handed_at: float,
    ) -> str:
        conn = self._connection()
        with self._lock:
            if key is not None:
                row = conn.execute(
                    "SELECT seq FROM received WHERE idempotency_key = ?", (key,)
                ).fetchone()
                if row is not None:
                    conn.execute(
                        "INSERT INTO deduplicated (idempotency_key, at) VALUES (?, ?)",
                        (key, time.time()),
                    )
                    return f"{self.platform}-{row[0]}"
            cur = conn.execute(
                "INSERT INTO received (chat_id, thread_id, reply_to, content, media_uri,"
                " idempotency_key, sender_pid, at, sent_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    target.chat_id,
                    target.thread_id,
                    reply_to,
                    content,
                    media_uri,
                    key,
                    os.getpid(),
                    time.time(),
                    handed_at,
                ),
            )
            return f"{self.platform}-{cur.lastrowid}"


@attrs.frozen
class Received:
    seq: int
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    content: str
    media_uri: str | None
    idempotency_key: str | None
    sender_pid: int = 0
    sent_at: float = 0.0
    """When the gateway handed it to the platform (the driver's clock: same host)."""


def read_journal(path: str | Path) -> list[Received]:
    if not Path(path).exists():
        return []
    conn = open_journal(path)
    try:
        rows = conn.execute(
            "SELECT seq, chat_id, thread_id, reply_to, content, media_uri, idempotency_key,"
            " sender_pid, sent_at FROM received ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    return [Received(*row) for row in rows]


def count_deduplicated(path: str | Path) -> int:
    if not Path(path).exists():
        return 0
    conn = open_journal(path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM deduplicated").fetchone()[0])
    finally:
        conn.close()


def dead_chats(chats: Collection[str]) -> frozenset[str]:
    return frozenset(chats)
