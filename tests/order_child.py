"""A gateway process for the order tests (run by test_order_and_pacing.py).

``python tests/order_child.py ROLE STORE JOURNAL``

- ``owe``: record two replies to chat 7 with no platform connected (both owed, unsent),
  print ``recorded``, then wait to be killed (the crash).
- ``recover``: start with a slow platform (each hand-off journalled, then 0.4 s before it
  answers): the boot sweep claims the dead gateway's replies and re-sends them, slowly;
  print ``started`` once the sweep has claimed, then finish and exit.
- ``hold``: start with a platform whose chat window is a minute long: the boot sweep
  claims the dead gateway's replies, which then wait for the window; print ``claimed N``
  and wait to be killed before any is sent (ADR 0070).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.application.delivery.rate_limits import Limit, RateLimits
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.values import DeliveryTarget, MediaItem

CONTEXT = ReplyContext(session_key="agent:main:telegram:dm:7", platform="telegram", chat_id="7")


class JournalPlatform(AdapterBase):
    """Journals each hand-off (pid, text, when) before it answers, ``delay`` later."""

    def __init__(self, journal: str, delay: float = 0.0) -> None:
        self.platform = "telegram"
        self.journal = journal
        self.delay = delay

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
        line = {"pid": os.getpid(), "chat": target.chat_id, "text": content, "at": time.time()}
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        await asyncio.sleep(self.delay)
        return SendResult.ok(f"m-{time.monotonic_ns()}")


async def owe(store: str) -> None:
    gw = Gateway.open(store)
    await gw.start(())
    for n in (1, 2):
        outcome = await gw.deliver(CONTEXT, Reply(f"owed {n}"), f"in-{n}")
        assert outcome.status == "queued", outcome
    await gw.flush()
    print("recorded", flush=True)
    await asyncio.sleep(600)  # killed long before


async def recover(store: str, journal: str) -> None:
    gw = Gateway.open(store)
    platform = JournalPlatform(journal, delay=0.4)
    task = asyncio.create_task(gw.start([platform]))
    while gw.stats().recovered < 2:  # both claimed and on their way
        await asyncio.sleep(0.01)
    print("started", flush=True)
    report = await task
    assert report.claimed == 2 and report.redelivered == 2, report
    await gw.close()


async def hold(store: str, journal: str) -> None:
    gw = Gateway.open(store)
    platform = JournalPlatform(journal)
    platform.rate_limits = RateLimits(per_chat=Limit(1, 60.0))
    task = asyncio.create_task(gw.start([platform]))
    deadline = time.monotonic() + 15
    while gw.stats().recovered < 2 and time.monotonic() < deadline:  # waiting their window
        await asyncio.sleep(0.01)
    print(f"claimed {gw.stats().recovered}", flush=True)
    await task
    await asyncio.sleep(600)  # killed long before


if __name__ == "__main__":
    role, store = sys.argv[1], sys.argv[2]
    if role == "owe":
        asyncio.run(owe(store))
    elif role == "hold":
        asyncio.run(hold(store, sys.argv[3]))
    else:
        asyncio.run(recover(store, sys.argv[3]))
