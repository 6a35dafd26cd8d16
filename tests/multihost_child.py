"""A gateway process posing as one host of several (run by test_multihost_processes.py).

``python tests/multihost_child.py ROLE URL`` with GATEWAY_LEDGER_HOST,
GATEWAY_LEDGER_INSTALLATION_ID and the lease settings in the environment. It speaks one
line at a time on stdout (``ready``, ``sending <oid>``, a final JSON report) and waits for
commands on stdin, so the test decides when to kill, stop, continue and sweep.

- ``victim N``: delivers N replies whose sends never return; prints ``ready`` once all N
  are on their way (recorded as Attempting), then hangs until killed.
- ``survivor``: opens its gateway (taking a lease), prints ``ready``; on ``go`` runs its
  sweep (``Gateway.start``), re-sends what it won, prints the report.
- ``paused``: one reply fails (a retry is scheduled in 3 s), a second is mid-send when it
  prints ``sending``; on ``report`` prints what it sent and its late results.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.values import DeliveryTarget, ErrorClass, LedgerPolicy, MediaItem


class JournalAdapter(AdapterBase):
    """Prints every send it starts; answers from a script (``hang`` never answers)."""

    def __init__(self, script: Sequence[Any] = ()) -> None:
        self.platform = "telegram"
        self.script = list(script)
        self.sent: list[tuple[str, str]] = []

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
        oid = str(metadata["oid"])
        self.sent.append((oid, content))
        say(f"sending {oid}")
        step = self.script.pop(0) if self.script else "ok"
        if step == "hang":
            await asyncio.Event().wait()
        if isinstance(step, float):
            await asyncio.sleep(step)
            step = "ok"
        if step == "fail":
            return SendResult.failed(ErrorClass.AMBIGUOUS, "timeout")
        return SendResult.ok(f"{oid}-msg")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def read_line() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


def reply(i: int, host: str) -> tuple[ReplyContext, Reply, str]:
    key = f"agent:main:telegram:dm:{host}-{i}"
    oid = compute_obligation_id(key, f"in-{i}", f"reply {i} from {host}")
    context = ReplyContext(session_key=key, platform="telegram", chat_id=str(i))
    return context, Reply(f"reply {i} from {host}", metadata={"oid": oid}), f"in-{i}"


async def victim(url: str, count: int) -> None:
    adapter = JournalAdapter(["hang"] * count)
    gw = Gateway.open(url)
    await gw.start([adapter])
    tasks = [asyncio.create_task(gw.deliver(*reply(i, gw.owner.host))) for i in range(count)]
    while len(adapter.sent) < count:
        await asyncio.sleep(0.01)
    say("ready")
    await asyncio.gather(*tasks)


async def survivor(url: str) -> None:
    adapter = JournalAdapter()
    gw = Gateway.open(url)
    say("ready")
    await read_line()
    report = await gw.start([adapter])
    say(
        json.dumps(
            {
                "host": gw.owner.host,
                "claimed": report.claimed,
                "redelivered": report.redelivered,
                "sent": adapter.sent,
                "lost_races": gw.ledger.last_sweep.lost_races if gw.ledger.last_sweep else None,
            }
        )
    )
    await gw.close()


async def paused(url: str) -> None:
    adapter = JournalAdapter(["fail", 1.0])
    policy = LedgerPolicy(retry_backoff=(timedelta(seconds=3),))
    gw = Gateway.open(url, policy=policy)
    await gw.start([adapter])
    first = await gw.deliver(*reply(0, gw.owner.host))
    assert first.status == "failed" and first.retry_in == 3.0, first
    second = await gw.deliver(*reply(1, gw.owner.host))
    await read_line()  # "report", sent after SIGCONT and the claims
    await asyncio.sleep(3.5)  # past the scheduled retry
    stats = gw.stats()
    say(
        json.dumps(
            {
                "ids": [first.obligation_id, second.obligation_id],
                "second": second.status,
                "sent": adapter.sent,
                "late_results": stats.late_results,
                "ledger_faults": stats.ledger_faults,
            }
        )
    )
    await gw.close()


def main() -> None:
    role, url = sys.argv[1], sys.argv[2]
    if role == "victim":
        asyncio.run(victim(url, int(sys.argv[3])))
    elif role == "survivor":
        asyncio.run(survivor(url))
    else:
        asyncio.run(paused(url))


if __name__ == "__main__":
    main()
