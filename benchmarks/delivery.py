"""Delivery lifecycles per second: gateway-ledger's delivery path vs an upstream-style ledger.

Baseline (written here, like upstream): one mutable SQLite row per obligation, INSERT then
two UPDATEs, one transaction each, called synchronously (upstream calls it on the event
loop). Ours: ``Gateway.deliver`` with a platform that answers at once: record+attempting
in one commit, delivered in a second, group-committed across concurrent conversations on
a writer thread. Both on SQLite in WAL mode with ``synchronous=FULL`` (SQLite's default),
on the same disk, measured in one run.

The machine is shared, so one run of each side says little: the script runs several
rounds, each measuring the baseline and ours back to back on fresh files (which side
goes first alternates), and prints the median rate of each side and the median of the
per-round ratios.

    python benchmarks/delivery.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway_ledger.application.gateway import Gateway
from gateway_ledger.application.ledger import DeliveryLedger
from gateway_ledger.application.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.domain.obligation import compute_obligation_id
from gateway_ledger.domain.values import DeliveryTarget, MediaItem

CONCURRENCY = 64


class MutableRowLedger:
    """Upstream's shape: one row, updated in place, one transaction per call."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None, timeout=10)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS delivery_obligations (obligation_id TEXT PRIMARY KEY,"
            " session_key TEXT, platform TEXT, chat_id TEXT, thread_id TEXT, content TEXT,"
            " state TEXT, attempts INTEGER DEFAULT 0, owner_pid INTEGER, owner_start INTEGER,"
            " last_error TEXT, created_at REAL, updated_at REAL)"
        )

    def synchronous(self) -> int:
        return int(self.conn.execute("PRAGMA synchronous").fetchone()[0])

    def _tx(self, sql: str, params: tuple[Any, ...]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(sql, params)
        self.conn.execute("COMMIT")

    def record(self, oid: str, key: str, chat: str, content: str) -> None:
        now = time.time()
        self._tx(
            "INSERT OR IGNORE INTO delivery_obligations (obligation_id, session_key, platform,"
            " chat_id, thread_id, content, state, owner_pid, owner_start, created_at,"
            " updated_at) VALUES (?, ?, 'telegram', ?, NULL, ?, 'pending', 1, 1, ?, ?)",
            (oid, key, chat, content, now, now),
        )

    def mark(self, oid: str, state: str) -> None:
        self._tx(
            "UPDATE delivery_obligations SET state = ?, updated_at = ? WHERE obligation_id = ?",
            (state, time.time(), oid),
        )


class InstantPlatform(AdapterBase):
    platform = "telegram"

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
        await asyncio.sleep(0)
        return SendResult.ok("1")


def work(n: int, conv: int) -> tuple[str, str, str, str]:
    key = f"agent:main:telegram:dm:{conv}"
    content = f"reply {n} to conversation {conv}: " + "x" * 200
    return compute_obligation_id(key, f"in-{n}", content), key, str(conv), content


async def baseline(path: Path, total: int, concurrency: int) -> float:
    ledger = MutableRowLedger(path)
    assert ledger.synchronous() == 2  # FULL

    async def conversation(conv: int, count: int) -> None:
        for n in range(count):
            oid, key, chat, content = work(n, conv)
            ledger.record(oid, key, chat, content)  # sync on the loop, as upstream does
            ledger.mark(oid, "attempting")
            await asyncio.sleep(0)  # the send
            ledger.mark(oid, "delivered")

    started = time.perf_counter()
    per = total // concurrency
    await asyncio.gather(*(conversation(c, per) for c in range(concurrency)))
    elapsed = time.perf_counter() - started
    ledger.conn.close()
    return per * concurrency / elapsed


async def ours(
    path: Path, total: int, concurrency: int, *, encrypt: bool = True
) -> tuple[float, int]:
    gateway = Gateway(DeliveryLedger.open(path, encrypt=encrypt))
    with gateway.ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute("PRAGMA synchronous")
        assert c.fetchone()[0] == 2  # FULL, the library's (and SQLite's) default
    append: Any = getattr(gateway.writer, "_append", None)
    if hasattr(append, "synchronous"):
        assert append.synchronous() == 2  # the writer's own connection: FULL too
    await gateway.start([InstantPlatform()])

    async def conversation(conv: int, count: int) -> None:
        for n in range(count):
            _, key, chat, content = work(n, conv)
            out = await gateway.deliver(
                ReplyContext(key, "telegram", chat), Reply(content), f"in-{n}"
            )
            assert out.status == "delivered", out

    started = time.perf_counter()
    per = total // concurrency
    await asyncio.gather(*(conversation(c, per) for c in range(concurrency)))
    elapsed = time.perf_counter() - started
    commits = gateway.stats().commits
    await gateway.close()
    return per * concurrency / elapsed, commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer lifecycles (CI smoke run)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 7, quick 2)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 7)
    sequential = 150 if args.quick else 600
    concurrent = 640 if args.quick else 1280
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ledger-bench-"))
    scenarios = (
        ("(a) one conversation at a time", sequential, 1),
        (f"(b) {CONCURRENCY} concurrent conversations", concurrent, CONCURRENCY),
    )
    runs: dict[int, list[tuple[float, float, float, float]]] = {c: [] for _, _, c in scenarios}
    for r in range(rounds):
        for _, total, conc in scenarios:
            paths = {side: tmp / f"{side}-{conc}-{r}.db" for side in ("base", "ours", "clear")}
            sides = ["base", "ours", "clear"]
            order = sides[r % 3 :] + sides[: r % 3]  # rotate who runs first each round
            rate: dict[str, float] = {}
            commits = 0
            for side in order:
                if side == "base":
                    rate[side] = asyncio.run(baseline(paths[side], total, conc))
                elif side == "ours":
                    rate[side], commits = asyncio.run(ours(paths[side], total, conc))
                else:
                    rate[side], _ = asyncio.run(ours(paths[side], total, conc, encrypt=False))
            runs[conc].append((rate["base"], rate["ours"], rate["clear"], commits / total))
    print(
        "record -> attempting -> delivered lifecycles/s, SQLite WAL, synchronous=FULL,"
        f" median of {rounds} interleaved rounds; gateway-ledger encrypts personal fields"
        " (ADR 0012); the last columns run it with encrypt=False side by side"
    )
    print(
        "| scenario | mutable-row baseline | gateway-ledger | ratio | commits/lifecycle"
        " | encrypt=False | encryption cost |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ratios, costs = [], []
    for label, _, conc in scenarios:
        rows = runs[conc]
        base = statistics.median(b for b, _, _, _ in rows)
        mine = statistics.median(m for _, m, _, _ in rows)
        clear = statistics.median(c for _, _, c, _ in rows)
        ratio = statistics.median(m / b for b, m, _, _ in rows)
        spread = sorted(m / b for b, m, _, _ in rows)
        cost = statistics.median(1 - m / c for _, m, c, _ in rows)
        cpl = statistics.median(x for _, _, _, x in rows)
        ratios.append(ratio)
        costs.append(cost)
        print(
            f"| {label} | {base:,.0f}/s | {mine:,.0f}/s | {ratio:.2f}x"
            f" ({spread[0]:.2f}-{spread[-1]:.2f}) | {cpl:.2f} | {clear:,.0f}/s | {cost:+.1%} |"
        )
    print(f"targets: (a) >= 1x -> {ratios[0]:.2f}x, (b) >= 2x -> {ratios[1]:.2f}x")
    print(f"encryption cost target <= 15%: (a) {costs[0]:+.1%}, (b) {costs[1]:+.1%}")


if __name__ == "__main__":
    main()
