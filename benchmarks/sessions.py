"""Sessions benchmark: per-message cost must not grow with the store.

Pairs measured in one run (targets: each pair within 1.5x):
- resolve + append of a message, with 10 vs 10,000 sessions in the store;
- history(last=50) of a session holding 50 vs 10,000 messages.

Each operation's process CPU is printed too, in reference units ("u", ``reference.py``,
timed in the same run), so runs on one machine compare from hour to hour (ADR 0069).

    python benchmarks/sessions.py [--quick] [--location postgresql://...?schema=bench]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference import CpuMeter, cpu_seconds, machine

from gateway_ledger.bootstrap import SessionStore
from gateway_ledger.domain.sessions.route import SessionRoute
from gateway_ledger.domain.sessions.session import Session, format_session_id
from gateway_ledger.domain.sessions.source import SessionSource

T0 = datetime(2026, 7, 20, tzinfo=UTC)


def source(i: int) -> SessionSource:
    return SessionSource(platform="telegram", chat_id=str(100_000 + i), user_id=str(i))


def populate_sessions(store: SessionStore, count: int) -> None:
    """Create ``count`` sessions, saved in batches (setup only, not measured)."""
    batch: list[object] = []
    for i in range(count):
        src = source(i)
        key = store.session_key(src)
        session = Session.start(
            session_id=format_session_id(T0, f"{i:08x}"), key=key, source=src, now=T0
        )
        session.append_message(role="user", content=f"hello {i}", now=T0)
        batch += [session, SessionRoute.open(key=key, session_id=session.session_id, now=T0)]
        if len(batch) >= 1000:
            store.save(*batch)  # type: ignore[arg-type]
            batch = []
    if batch:
        store.save(*batch)  # type: ignore[arg-type]


def fill_messages(store: SessionStore, src: SessionSource, count: int) -> str:
    ctx = store.resolve(src, T0)
    done = 0
    while done < count:
        session = store.load_session(ctx.session_id)
        for _ in range(min(500, count - done)):
            done += 1
            session.append_message(role="user", content=f"message {done} " + "x" * 80, now=T0)
        store.save(session)
    return ctx.session_id


def interleaved(
    small: object, large: object, repeats: int, meter: CpuMeter, name: str
) -> tuple[float, float]:
    """Median ms of each, measured alternately so machine noise hits both sides alike;
    each side's CPU goes to ``meter`` as ``name/0`` and ``name/1``."""
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats):
        for side, fn in enumerate((small, large)):
            cpu = cpu_seconds()
            start = time.perf_counter()
            fn()  # type: ignore[operator]
            samples[side].append(time.perf_counter() - start)
            meter.add(f"{name}/{side}", cpu_seconds() - cpu)
        if i % 50 == 49:
            meter.sample()
    return statistics.median(samples[0]) * 1000, statistics.median(samples[1]) * 1000


def open_store(location: str, secret_dir: Path) -> SessionStore:
    return SessionStore.open(location, secret_dir=secret_dir)


def resolve_append_op(location: str, secret_dir: Path, sessions: int) -> object:
    store = open_store(location, secret_dir)
    populate_sessions(store, sessions)
    rng = random.Random(sessions)
    now = [T0 + timedelta(minutes=1)]

    def one() -> None:
        now[0] += timedelta(milliseconds=1)
        ctx = store.resolve(source(rng.randrange(sessions)), now[0])
        store.append(ctx, "user", "how are you?", now=now[0])

    for _ in range(20):  # warm-up
        one()
    return one


def history_op(location: str, secret_dir: Path, messages: int) -> object:
    store = open_store(location, secret_dir)
    session_id = fill_messages(store, source(999_999), messages)
    assert len(store.history(session_id, last=50)) == 50
    for _ in range(10):
        store.history(session_id, last=50)
    return lambda: store.history(session_id, last=50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 instead of 10,000")
    parser.add_argument("--location", help="postgresql:// URL base (default: SQLite files)")
    args = parser.parse_args()
    big = 1_000 if args.quick else 10_000
    ops = 100 if args.quick else 300
    tmp = Path(tempfile.mkdtemp(prefix="bench-sessions-"))

    def location(name: str) -> str:
        if args.location:
            sep = "&" if "?" in args.location else "?"
            return f"{args.location}{sep}schema=bench_{name}_{int(time.time())}"
        return str(tmp / f"{name}.db")

    secret_dir = tmp / "secrets"
    meter = CpuMeter()
    rows = [
        (
            "resolve + append",
            "10 sessions",
            f"{big:,} sessions",
            *interleaved(
                resolve_append_op(location("r_small"), secret_dir, 10),
                resolve_append_op(location("r_big"), secret_dir, big),
                ops,
                meter,
                "resolve + append",
            ),
        ),
        (
            "history(last=50)",
            "50 messages",
            f"{big:,} messages",
            *interleaved(
                history_op(location("h_small"), secret_dir, 50),
                history_op(location("h_big"), secret_dir, big),
                ops,
                meter,
                "history(last=50)",
            ),
        ),
    ]
    meter.close()
    store_kind = "PostgreSQL" if args.location else "SQLite"
    print(f"machine: {machine()}")
    print(f"sessions benchmark ({store_kind}, median of {ops} operations)")
    print("| operation | baseline | ms | large store | ms | ratio | CPU per operation |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for name, small_label, big_label, small, large in rows:
        cpu = " / ".join(f"{meter.units(f'{name}/{side}', ops):.2f} u" for side in (0, 1))
        print(
            f"| {name} | {small_label} | {small:.3f} | {big_label} | {large:.3f} "
            f"| {large / small:.2f}x | {cpu} |"
        )
    print(f"u = reference units: {meter.unit * 1e6:.0f} µs on this machine in this run")


if __name__ == "__main__":
    main()
