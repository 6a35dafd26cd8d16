"""What pacing costs when far below the limits (issue 18): the same delivery path, with
and without declared rate limits, side by side in one run.

Two gateways on two SQLite stores (encryption on, ``synchronous=FULL``), each delivering
64 concurrent conversations through a platform that answers at once: one declares no
limits (the pacer only keeps order), the other declares limits a thousand times above
the load (per bot and per chat), so every hand-off is counted in its windows and goes
through the bot's turnstile, but none waits. They take turns, one short segment each,
many times over, as ``delivery.py`` does; a shared, noisy machine slows both alike.

    python benchmarks/pacing.py [--segments N] [--per-segment N]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from delivery import InstantPlatform, work

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.application.delivery.rate_limits import Limit, RateLimits
from gateway_ledger.bootstrap import Gateway

CONCURRENCY = 64
GENEROUS = RateLimits(per_bot=Limit(1_000_000, 1.0), per_chat=Limit(1_000, 1.0))


class LimitedPlatform(InstantPlatform):
    rate_limits = GENEROUS


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def segment(gw: Gateway, first: int, count: int) -> tuple[float, float]:
    async def conversation(conv: int) -> None:
        for n in range(first, first + count):
            key, chat, content = work(n, conv)
            context = ReplyContext(session_key=key, platform="telegram", chat_id=chat)
            out = await gw.deliver(context, Reply(content), f"in-{n}")
            assert out.status == "delivered", out

    started, used = time.perf_counter(), cpu()
    await asyncio.gather(*(conversation(c) for c in range(CONCURRENCY)))
    await gw.flush()
    return time.perf_counter() - started, cpu() - used


async def main(segments: int, per_segment: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gateway-ledger-pacing-"))
    sides = {
        "no limits": (Gateway.open(folder / "plain.db"), InstantPlatform()),
        "limits far above": (Gateway.open(folder / "paced.db"), LimitedPlatform()),
    }
    for gw, platform in sides.values():
        await gw.start([platform])
        await segment(gw, 0, 2)  # warm up
    totals = {name: [0.0, 0.0, 0] for name in sides}
    first = 10
    for turn in range(segments):
        order = list(sides) if turn % 2 == 0 else list(reversed(sides))
        for name in order:
            seconds, used = await segment(sides[name][0], first, per_segment)
            totals[name][0] += seconds
            totals[name][1] += used
            totals[name][2] += CONCURRENCY * per_segment
        first += per_segment
    for name, (gw, _) in sides.items():
        pacing = gw.stats().pacing
        assert pacing is not None and pacing.waits == 0, (name, pacing)  # nothing waited
        await gw.close()
    rates = {}
    for name, (seconds, used, lifecycles) in totals.items():
        rates[name] = lifecycles / seconds
        print(
            f"{name:>18}: {rates[name]:8.0f} lifecycles/s, "
            f"{used / lifecycles * 1e6:6.0f} µs CPU per lifecycle ({lifecycles} lifecycles)"
        )
    ratio = rates["limits far above"] / rates["no limits"]
    print(f"paced / unpaced throughput: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--per-segment", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main(args.segments, args.per_segment))
