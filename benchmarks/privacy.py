"""Encryption overhead on lifecycle throughput: record -> attempting -> delivered.

Runs the real DeliveryLedger on SQLite (default ``synchronous``), encrypted and not,
side by side in one run: two fresh stores, lifecycles interleaved one by one (alternating
which mode goes first), each mode's lifecycles timed and summed, so disk and CPU noise from
a shared machine falls on both modes alike. Two workloads: replies to sessions that
already have a key (the usual case: a session gets many replies), and a new session for
every reply (every reply creates and stores a data key: the worst case). The session half
likewise: ``SessionStore.resolve`` + ``append`` of an inbound message (with its platform
message id, so the dedupe marker is written too), in 10-message conversations and with a
new conversation per message.

    python benchmarks/privacy.py [--quick] [--postgres URL]

Target (issue 8): encryption costs at most 15% of lifecycle throughput.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.sessions.source import SessionSource

T0 = datetime(2026, 7, 20, tzinfo=UTC)


class Lifecycles:
    """One ledger and a stream of replies: each call runs one full lifecycle, timed."""

    def __init__(self, location: str, *, encrypt: bool, sessions: int | None) -> None:
        self.ledger = DeliveryLedger.open(location, encrypt=encrypt)
        self.sessions = sessions
        self.prefix = uuid.uuid4().hex[:8]
        self.i = 0
        self.elapsed = 0.0
        for s in range(sessions or 1):  # warm-up: tables, connections, reused sessions' keys
            self._record(f"warm-{s}", s)

    def _record(self, oid: str, s: int) -> None:
        self.ledger.record_obligation(
            obligation_id=f"{self.prefix}-{oid}",
            session_key=f"agent:main:telegram:dm:{self.prefix}{s}",
            platform="telegram",
            chat_id=f"{self.prefix}{s}",
            thread_id="42",
            reply_to=f"inbound-{oid}",
            content=f"Here is the answer to question {oid}: " + "lorem ipsum " * 20,
            metadata={"user_name": "Alice Example", "format": "markdown"},
        )

    def one(self) -> None:
        i = self.i
        self.i += 1
        s = i % self.sessions if self.sessions else i + 1
        oid = f"{self.prefix}-{i}"
        started = time.perf_counter()
        self._record(str(i), s)
        self.ledger.mark_attempting(oid)
        self.ledger.mark_delivered(oid, [f"platform-msg-{i}"])
        self.elapsed += time.perf_counter() - started

    def rate(self) -> float:
        return self.i / self.elapsed


class Messages:
    """One session store and a stream of inbound messages: resolve + append, timed."""

    def __init__(self, location: str, *, encrypt: bool, sessions: int | None, secrets: Path):
        self.store = SessionStore.open(location, secret_dir=secrets, encrypt=encrypt)
        self.ledger = self.store  # closed like the ledger side
        self.sessions = sessions
        self.prefix = uuid.uuid4().hex[:8]
        self.i = 0
        self.elapsed = 0.0
        for s in range(sessions or 1):  # warm-up: tables, routes, reused sessions' keys
            self._message(f"warm-{s}", s)

    def _message(self, mid: str, s: int) -> None:
        source = SessionSource(
            platform="telegram",
            chat_id=f"{self.prefix}{s}",
            chat_type="group",
            chat_name="Example family",
            user_id=f"7{s}",
            user_name="Alice Example",
        )
        now = T0 + timedelta(seconds=self.i)
        ctx = self.store.resolve(source, now)
        self.store.append(ctx, "user", f"question {mid}: " + "lorem ipsum " * 20, mid, now=now)

    def one(self) -> None:
        i = self.i
        self.i += 1
        s = i % self.sessions if self.sessions else i + 1
        started = time.perf_counter()
        self._message(f"in-{i}", s)
        self.elapsed += time.perf_counter() - started

    def rate(self) -> float:
        return self.i / self.elapsed


def new_location(base: Path, postgres: str | None, tag: str) -> str:
    if postgres:
        sep = "&" if "?" in postgres else "?"
        return f"{postgres}{sep}schema=bench_{tag}_{uuid.uuid4().hex[:8]}"
    return str(base / f"{tag}-{uuid.uuid4().hex[:8]}.db")


def drop(location: str) -> None:
    if location.startswith("postgresql://"):
        from psycopg import sql

        from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

        params = parse_postgres_url(location)
        with connect(params) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(params["schema"]))
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer lifecycles and rounds")
    parser.add_argument("--postgres", help="also run on this postgresql:// URL")
    args = parser.parse_args(argv)
    n = 300 if args.quick else 2000
    base = Path(tempfile.mkdtemp(prefix="gl-privacy-bench-"))
    os.environ.setdefault("GATEWAY_LEDGER_KEY_DIR", str(base / "keys"))
    stores = [("sqlite", None)] + ([("postgresql", args.postgres)] if args.postgres else [])
    secrets = base / "secrets"
    workloads: list[tuple[str, str, int | None, Any]] = [
        ("ledger", "10 replies per session", n // 10, Lifecycles),
        ("ledger", "new session per reply", None, Lifecycles),
        ("sessions", "10 messages per session", n // 10, Messages),
        ("sessions", "new session per message", None, Messages),
    ]
    print(
        f"ledger: record -> attempting -> delivered; sessions: resolve + append; {n} "
        "operations per mode, interleaved one by one"
    )
    print()
    print("| store | half | workload | clear (ops/s) | encrypted (ops/s) | overhead |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    worst = 0.0
    for store, url in stores:
        for half, label, sessions, kind in workloads:
            locations = [new_location(base, url, "clr"), new_location(base, url, "enc")]
            extra = {"secrets": secrets} if kind is Messages else {}
            try:
                clear = kind(locations[0], encrypt=False, sessions=sessions, **extra)
                sealed = kind(locations[1], encrypt=True, sessions=sessions, **extra)
                # Alternate which goes first, so disk and CPU noise falls on both alike.
                for i in range(n):
                    pair = (clear, sealed) if i % 2 == 0 else (sealed, clear)
                    for side in pair:
                        side.one()
                clear.ledger.close()
                sealed.ledger.close()
            finally:
                for loc in locations:
                    drop(loc)
            overhead = (clear.rate() - sealed.rate()) / clear.rate() * 100
            worst = max(worst, overhead)
            print(
                f"| {store} | {half} | {label} | {clear.rate():,.0f} | {sealed.rate():,.0f} "
                f"| {overhead:+.1f}% |",
                flush=True,
            )
    print()
    verdict = "within" if worst <= 15 else "ABOVE"
    print(f"worst overhead {worst:+.1f}% ({verdict} the 15% target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
