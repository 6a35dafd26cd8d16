"""A gateway turn's CPU: the conversation's history and the reply's delivery.

``delivery.py`` measures the reply's delivery alone. A gateway's turn also keeps the
conversation (``SessionStore``, README *Sessions*): resolve the inbound message's session,
append the message, and append the reply once it is made. This prints, in reference units
(``reference.py``, timed in turns with the work), the process CPU of each half of a turn
with encryption on, on SQLite (``--postgres URL``: on PostgreSQL, in schemas of its own,
dropped afterwards):

- the sessions' part: resolve, append the message, append the reply, for 64
  conversations in turn (the session store's calls are synchronous);
- the delivery of the reply: ``Gateway.deliver`` for 64 conversations at once, as
  ``delivery.py`` (b) runs it;

and their sum. ``--code DIR`` measures the package of another checkout (an earlier
commit, for a before/after pair on one machine): its ``gateway_ledger`` is imported
instead of this one's, with this folder's scripts.

    python benchmarks/turn.py [--quick] [--code DIR] [--postgres URL]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = datetime(2026, 7, 20, tzinfo=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns (smoke run)")
    parser.add_argument("--code", help="a checkout whose gateway_ledger to measure")
    parser.add_argument("--postgres", help="a postgresql:// URL: both halves there")
    args = parser.parse_args()
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    sys.path.insert(1 if args.code else 0, str(HERE))
    turns = 4 if args.quick else 10  # per conversation, per round
    rounds = 3 if args.quick else 5
    with tempfile.TemporaryDirectory(prefix="bench-turn-") as tmp:
        sessions, delivery, unit = asyncio.run(measure(Path(tmp), turns, rounds, args.postgres))
    from delivery import CONCURRENCY
    from reference import machine

    import gateway_ledger

    code = Path(gateway_ledger.__file__).resolve().parent.parent
    store = "PostgreSQL" if args.postgres else "SQLite"
    print(f"machine: {machine()}")
    print(f"a turn's CPU, {CONCURRENCY} conversations, {store}, encryption on ({code}):")
    print(f"  the sessions' part (resolve, append, append): {sessions:.2f} u")
    print(f"  the reply's delivery (Gateway.deliver):       {delivery:.2f} u")
    print(f"  a turn:                                       {sessions + delivery:.2f} u")
    print(f"u = reference units: {unit * 1e6:.0f} µs on this machine in this run")


async def measure(
    tmp: Path, turns: int, rounds: int, postgres: str | None = None
) -> tuple[float, float, float]:
    """Reference units per turn: the sessions' part, the delivery, and the unit."""
    from delivery import CONCURRENCY, Ours, drop_schema, our_location, work
    from reference import CpuMeter, cpu_seconds

    from gateway_ledger.bootstrap import SessionStore
    from gateway_ledger.domain.sessions.source import SessionSource

    ledger_at, sessions_at = (our_location(tmp, name, postgres) for name in ("turn", "sessions"))
    ours = await Ours.open(ledger_at, encrypt=True)
    store = SessionStore.open(str(sessions_at), secret_dir=tmp / "secrets")
    sources = [
        SessionSource(platform="telegram", chat_id=str(c), user_id=str(c))
        for c in range(CONCURRENCY)
    ]
    meter = CpuMeter()

    def history(first: int) -> float:
        started = cpu_seconds()
        for n in range(first, first + turns):
            now = T0 + timedelta(minutes=n)
            for conv, source in enumerate(sources):
                context = store.resolve(source, now)
                store.append(context, "user", f"message {n} of conversation {conv}", f"m{n}", now)
                store.append(context, "assistant", work(n, conv)[2], now=now)
        return cpu_seconds() - started

    async def delivery(first: int) -> float:
        return (await ours.segment(first, turns, CONCURRENCY))[2]

    try:
        history(0)  # warm-up, both halves
        await delivery(0)
        for r in range(1, rounds + 1):
            meter.add("sessions", history(r * turns))
            meter.add("delivery", await delivery(r * turns))
            meter.sample()
    finally:
        await ours.close()
        store.close()
        for location in (ledger_at, sessions_at):
            drop_schema(location)
    meter.close()
    done = CONCURRENCY * turns * rounds
    return meter.units("sessions", done), meter.units("delivery", done), meter.unit


if __name__ == "__main__":
    main()
