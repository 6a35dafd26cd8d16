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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from gateway_ledger.application.delivery.ports import AdapterBase, SendResult
from gateway_ledger.application.delivery.rate_limits import RateLimits
from gateway_ledger.application.delivery.reconciliation import (
    ReconcileAnswer,
    ReconcileQuery,
    obligation_of,
)
from gateway_ledger.domain.values import DeliveryTarget, ErrorClass, MediaItem
from gateway_ledger.entrypoints.simulation.limits import (
    LIMITS_SCHEMA,
    BanRule,
    Refusal,
    check_handoff,
    limits_from_dict,
)

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
    sent_at REAL,
    nonce TEXT,
    failed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS received_nonce ON received (nonce);
CREATE INDEX IF NOT EXISTS received_chat ON received (chat_id, seq);
CREATE TABLE IF NOT EXISTS deduplicated (
    idempotency_key TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS reconcile_requests (
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    obligation_id TEXT NOT NULL,
    asker_pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS callbacks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    nonce TEXT NOT NULL,
    message_id TEXT NOT NULL,
    status TEXT NOT NULL,
    at REAL NOT NULL,
    claimed_by INTEGER,
    tries INTEGER NOT NULL DEFAULT 0,
    done INTEGER NOT NULL DEFAULT 0
);
"""
"""``received``: what the platform took (``failed``: it dropped the message after taking
it, so the user never saw it; ``nonce``: the key the gateway placed on it). ``callbacks``:
the status webhooks the platform owes the gateway, delivered by whichever gateway of the
run is connected, and re-delivered when the one that took one died before it landed."""

RECONCILE_KINDS = ("none", "nonce", "history", "callbacks")
"""How a simulated platform answers reconciliation (ADR 0050): not at all (Telegram
has no way), by the nonce echoed on the message (Discord ``nonce``), by a paged,
rate-limited read of the chat's history (Slack ``conversations.history`` with
``client_msg_id``), or from the status webhooks already received (WhatsApp)."""


StatusSink = Callable[[str, str, datetime, str, str], Awaitable[bool]]
"""``Gateway.report_status(obligation_id, status, at, detail, message_id)``."""
STATUS_POLL = 0.02
"""Seconds between two looks for owed status webhooks."""
STATUS_REDELIVERY_SECONDS = 120.0
"""How long the platform re-delivers a status webhook that the gateways refuse before it
gives up on it (``done = 2``). The time runs from when the webhook was raised, however many
gateway processes refused it meanwhile: platforms re-deliver on their own schedule, for a
long while (WhatsApp for days). A webhook refused while its reply is still being sent then
lands once the reply is delivered, and reopens it. It used to be a count of 1,500
deliveries, which the run's gateways spent together, each polling: with several of them
alive, it ran out within about ten seconds. A CI run then lost a part. A backlog reply
had been paced for 23 s, and its failed first part was never reported."""


def _limit_items(
    value: Mapping[str, Sequence[float]] | Sequence[Sequence[Any]],
) -> tuple[tuple[str, float, float], ...]:
    """Limits as a hashable value: ``(name, sends, per)`` sorted by name."""
    items = value.items() if isinstance(value, Mapping) else ((n, (s, p)) for n, s, p in value)
    return tuple(sorted((str(n), int(pair[0]), float(pair[1])) for n, pair in items))


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
    reconcile: str = "none"  # one of RECONCILE_KINDS
    failed_after_acceptance: float = 0.0  # taken, then dropped: a status callback says so
    device_statuses: float = 0.0  # share of messages whose delivered/read callbacks follow
    history_page: int = 20  # messages per history read (one page: one round trip)
    history_rate: float = 50.0  # history reads per second before the platform says 429
    rate_limited_bot: float = 0.0  # share of the random 429s that pause the whole bot
    limits: tuple[tuple[str, float, float], ...] = attrs.field(default=(), converter=_limit_items)
    """The limits it declares and enforces (``limits.py``): ``{"per_chat": [1, 0.05]}``."""
    ban: tuple[int, float, float] | None = None
    """(violations, within seconds, ban seconds): Telegram's flood control; None: no bans."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlatformBehaviour:
        d = dict(data)
        for name in ("latency", "retry_after", "ban"):
            if d.get(name) is not None:
                d[name] = tuple(d[name])
        if "dead_chats" in d:
            d["dead_chats"] = frozenset(d["dead_chats"])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["dead_chats"] = sorted(self.dead_chats)
        d["latency"] = list(self.latency)
        d["retry_after"] = list(self.retry_after)
        d["limits"] = {name: [sends, per] for name, sends, per in self.limits}
        d["ban"] = None if self.ban is None else list(self.ban)
        return d

    @property
    def rate_limits(self) -> RateLimits | None:
        """What the adapter declares to the gateway (None: nothing, so nothing is paced)."""
        if not self.limits:
            return None
        return limits_from_dict({name: (sends, per) for name, sends, per in self.limits})

    @property
    def ban_rule(self) -> BanRule | None:
        return None if self.ban is None else BanRule(int(self.ban[0]), *self.ban[1:])


def open_journal(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    for attempt in range(50):  # two processes opening a new journal: one switches it to WAL
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.05)
    conn.execute("PRAGMA synchronous=NORMAL")  # survives a killed process, which is the test
    conn.executescript(JOURNAL_SCHEMA)
    conn.executescript(LIMITS_SCHEMA)
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
        self.rate_limits = self.behaviour.rate_limits
        self._ban = self.behaviour.ban_rule
        self.journal_path = str(journal)
        self._rng = random.Random(seed)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"platform-{platform}"
        )
        self._sink: StatusSink | None = None
        self._poller: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._connection)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_journal(self.journal_path)
        return self._conn

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        self._pool.shutdown(wait=True)
        if self._conn is not None:
            self._conn.close()

    # -- status webhooks (ADR 0050) ----------------------------------------------------------

    def attach_status_sink(self, sink: StatusSink) -> None:
        """The gateway's hook: statuses the platform reports after it took a message are
        handed to ``sink``, in the order the platform sent them, by a poller on this loop."""
        self._sink = sink
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._deliver_statuses())

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait until no status webhook is owed (or ``timeout``): a finishing gateway
        delivers what its platform still has to say before it exits."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not await loop.run_in_executor(self._pool, self._callbacks_owed):
                return
            await asyncio.sleep(STATUS_POLL)

    def _callbacks_owed(self) -> int:
        row = self._connection().execute("SELECT COUNT(*) FROM callbacks WHERE done = 0").fetchone()
        return int(row[0])

    async def _deliver_statuses(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await loop.run_in_executor(self._pool, self._take_callbacks)
            for row_id, nonce, message_id, status, at in batch:
                sink = self._sink
                landed = False
                if sink is not None:
                    try:
                        await sink(
                            obligation_of(nonce),
                            status,
                            datetime.fromtimestamp(at, UTC),
                            "",
                            message_id,
                        )
                        landed = True
                    except Exception:
                        landed = False  # not now (its Delivered has not landed): again later
                await loop.run_in_executor(self._pool, self._settle_callback, row_id, landed)
            await asyncio.sleep(STATUS_POLL)

    def _take_callbacks(self) -> list[tuple[int, str, str, str, float]]:
        """The owed webhooks nobody alive is delivering, oldest first, taken by this process."""
        conn = self._connection()
        with self._lock:
            rows = conn.execute(
                "SELECT id, nonce, message_id, status, at, claimed_by FROM callbacks"
                " WHERE done = 0 ORDER BY id LIMIT 50"
            ).fetchall()
            me = os.getpid()
            taken = []
            for row_id, nonce, message_id, status, at, claimed_by in rows:
                if claimed_by not in (None, me) and pid_running(claimed_by):
                    continue
                cur = conn.execute(
                    "UPDATE callbacks SET claimed_by = ? WHERE id = ? AND done = 0"
                    " AND (claimed_by IS ? OR claimed_by = ?)",
                    (me, row_id, claimed_by, claimed_by),
                )
                if cur.rowcount:
                    taken.append((row_id, nonce, message_id, status, at))
            return taken

    def _settle_callback(self, row_id: int, landed: bool) -> None:
        conn = self._connection()
        with self._lock:
            if landed:
                conn.execute("UPDATE callbacks SET done = 1 WHERE id = ?", (row_id,))
            else:  # refused for now; a platform stops re-delivering a webhook at some point
                conn.execute(
                    "UPDATE callbacks SET claimed_by = NULL, tries = tries + 1,"
                    " done = CASE WHEN ? - at >= ? THEN 2 ELSE 0 END WHERE id = ?",
                    (time.time(), STATUS_REDELIVERY_SECONDS, row_id),
                )

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
        loop = asyncio.get_running_loop()
        if self.rate_limits is not None:  # judged at the hand-off instant, before any wait
            refusal = await loop.run_in_executor(self._pool, self._check, target, handed_at)
            if refusal is not None:
                return SendResult.failed(
                    ErrorClass.RATE_LIMITED,
                    f"429 too many requests ({refusal.kind})",
                    refusal.retry_after,
                    refusal.scope,
                )
        await asyncio.sleep(rng.uniform(*b.latency))
        if target.chat_id in b.dead_chats:
            return SendResult.failed(ErrorClass.DEAD_TARGET, "403 bot was blocked by the user")
        roll = rng.random()
        if roll < b.rejected:
            return SendResult.failed(ErrorClass.REJECTED, "400 bad request")
        roll -= b.rejected
        if roll < b.rate_limited:
            scope = "bot" if rng.random() < b.rate_limited_bot else "chat"
            return SendResult.failed(
                ErrorClass.RATE_LIMITED,
                "429 too many requests",
                rng.uniform(*b.retry_after),
                scope,
            )
        roll -= b.rate_limited
        if roll < b.ambiguous_before:
            raise TimeoutError("request timed out before it was sent")
        roll -= b.ambiguous_before
        fate = rng.random()
        message_id = await loop.run_in_executor(
            self._pool,
            self._arrive,
            target,
            content,
            reply_to,
            media[0].uri if media else None,
            idempotency_key if b.idempotent else None,
            handed_at,
            idempotency_key,
            fate,
        )
        await asyncio.sleep(b.hold_after_arrival or rng.uniform(*b.latency))
        if roll < b.ambiguous_after:
            raise TimeoutError("response lost after the message arrived")
        return SendResult.ok(message_id)

    def _check(self, target: DeliveryTarget, at: float) -> Refusal | None:
        assert self.rate_limits is not None
        with self._lock:
            return check_handoff(
                self._connection(), self.rate_limits, self._ban, target, at, os.getpid()
            )

    def _arrive(
        self,
        target: DeliveryTarget,
        content: str,
        reply_to: str | None,
        media_uri: str | None,
        key: str | None,
        handed_at: float,
        nonce: str | None = None,
        fate: float = 1.0,
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
            b = self.behaviour
            fails = nonce is not None and fate < b.failed_after_acceptance
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute(
                "INSERT INTO received (chat_id, thread_id, reply_to, content, media_uri,"
                " idempotency_key, sender_pid, at, sent_at, nonce, failed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    nonce,
                    int(fails),
                ),
            )
            statuses: tuple[str, ...] = ()
            if fails:
                statuses = ("failed_after_acceptance",)
            elif nonce is not None and fate > 1.0 - b.device_statuses:
                statuses = ("delivered_to_device", "read")
            for status in statuses:
                conn.execute(
                    "INSERT INTO callbacks (nonce, message_id, status, at) VALUES (?, ?, ?, ?)",
                    (nonce, f"{self.platform}-{cur.lastrowid}", status, time.time()),
                )
            conn.execute("COMMIT")
            return f"{self.platform}-{cur.lastrowid}"


class ReconcilingPlatform(SimulatedPlatform):
    """A simulated platform that answers reconciliation (ADR 0050), the way its
    behaviour's ``reconcile`` says; ``round_trips`` counts the requests it cost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips = 0
        self._bucket = (self.behaviour.history_rate, time.monotonic())

    async def reconcile(self, query: ReconcileQuery) -> ReconcileAnswer:
        loop = asyncio.get_running_loop()
        kind = self.behaviour.reconcile
        if kind == "history":
            await loop.run_in_executor(self._pool, self._count_request, kind, query)
            if not self._take_token():
                return ReconcileAnswer.unknown("history read rate limited (429)")
            await asyncio.sleep(self._rng.uniform(*self.behaviour.latency))
            return await loop.run_in_executor(self._pool, self._read_history, query)
        if kind == "nonce":
            await loop.run_in_executor(self._pool, self._count_request, kind, query)
            await asyncio.sleep(self._rng.uniform(*self.behaviour.latency))
        # "callbacks": the webhooks already received say it: no request to the platform
        return await loop.run_in_executor(self._pool, self._find_nonce, query, kind)

    def _count_request(self, kind: str, query: ReconcileQuery) -> None:
        """One request to the platform, kept in its journal with the obligation it asked
        about and the process that asked: a killed gateway's request too."""
        self.round_trips += 1
        with self._lock:
            self._connection().execute(
                "INSERT INTO reconcile_requests (kind, at, obligation_id, asker_pid)"
                " VALUES (?, ?, ?, ?)",
                (kind, time.time(), query.obligation_id, os.getpid()),
            )

    def _take_token(self) -> bool:
        tokens, since = self._bucket
        now = time.monotonic()
        rate = self.behaviour.history_rate
        tokens = min(rate, tokens + (now - since) * rate)
        if tokens < 1:
            self._bucket = (tokens, now)
            return False
        self._bucket = (tokens - 1, now)
        return True

    def _find_nonce(self, query: ReconcileQuery, kind: str) -> ReconcileAnswer:
        row = (
            self._connection()
            .execute("SELECT seq FROM received WHERE nonce = ? AND failed = 0", (query.key,))
            .fetchone()
        )
        if row is not None:
            return ReconcileAnswer.arrived(f"{self.platform}-{row[0]}", evidence=f"{kind} found")
        return ReconcileAnswer.not_arrived(f"no message with that {kind}")

    def _read_history(self, query: ReconcileQuery) -> ReconcileAnswer:
        """One page of the chat's newest messages: the key found, or the page reaches back
        before the window (proof it is not there), or it does not (unknown)."""
        page = (
            self._connection()
            .execute(
                "SELECT seq, nonce, at, failed FROM received WHERE chat_id = ?"
                " ORDER BY seq DESC LIMIT ?",
                (query.target.chat_id, self.behaviour.history_page),
            )
            .fetchall()
        )
        for seq, nonce, _, failed in page:
            if nonce == query.key and not failed:
                return ReconcileAnswer.arrived(f"{self.platform}-{seq}", evidence="in history")
        covered = len(page) < self.behaviour.history_page or (
            page and page[-1][2] < query.since.timestamp()
        )
        if covered:
            return ReconcileAnswer.not_arrived(f"history since the window: {len(page)} messages")
        return ReconcileAnswer.unknown("the window reaches past one page of history")


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            " sender_pid, sent_at FROM received WHERE failed = 0 ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    return [Received(*row) for row in rows]


def read_reconcile_requests(path: str | Path) -> list[tuple[str, int]]:
    """Requests the platform answered for reconciliation, by every gateway of the run:
    (obligation id, the asking process's pid) each."""
    if not Path(path).exists():
        return []
    conn = open_journal(path)
    try:
        rows = conn.execute("SELECT obligation_id, asker_pid FROM reconcile_requests").fetchall()
    finally:
        conn.close()
    return [(oid, pid) for oid, pid in rows]


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
