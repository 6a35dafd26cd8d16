"""A gateway process that is paused mid-reply (run by test_fencing_processes.py).

``python tests/fencing_child.py URL JOURNAL`` with GATEWAY_LEDGER_HOST,
GATEWAY_LEDGER_INSTALLATION_ID and the lease settings in the environment. It delivers one
two-part reply through a fake platform that appends every hand-off to JOURNAL (one JSON
line each, flushed and synced, so the test reads what reached the platform even if this
process is stopped or killed). The first part is slow (1.5 s): the test stops the process
inside it. On exit it prints the outcome as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gateway_ledger.application.delivery.ports import AdapterBase, Reply, ReplyContext, SendResult
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.values import DeliveryTarget, MediaItem


class FilePlatform(AdapterBase):
    """Journals each hand-off (its text) before answering; the first one is slow."""

    def __init__(self, journal: str) -> None:
        self.platform = "telegram"
        self.journal = journal
        self.count = 0

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
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "text": content}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.count += 1
        if self.count == 1:
            await asyncio.sleep(1.5)
        return SendResult.ok(f"msg-{self.count}")


async def main(url: str, journal: str) -> None:
    gw = Gateway.open(url)
    await gw.start([FilePlatform(journal)])
    context = ReplyContext(
        session_key="agent:main:telegram:dm:fenced", platform="telegram", chat_id="7"
    )
    reply = Reply("part one, part two", parts=("part one, ", "part two"))
    outcome = await gw.deliver(context, reply, "in-1")
    print(json.dumps({"status": outcome.status, "oid": outcome.obligation_id}), flush=True)
    await gw.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
