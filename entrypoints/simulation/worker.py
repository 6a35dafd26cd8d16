"""One gateway process of a simulation (or of the end-to-end test): really killable.

``python -m gateway_ledger.entrypoints.simulation.worker SPEC ROLE INDEX``

- role ``worker``: start (the boot sweep), then run its conversations (turns in order,
  conversations concurrently), wait for runtime retries, touch ``done-INDEX``, exit 0.
  Re-running after a kill is safe: a turn already recorded is not sent again.
- role ``sweeper``: start (sweep and re-send what it claimed), wait for retries, exit.
- role ``backlog`` (``simulate --backlog``): a gateway with no platform connected records
  the first turns of many conversations (owed, unsent: ``queued``), writes
  ``backlog.json`` and waits for the driver's SIGKILL; the workers' boot sweeps then
  recover them all at once, through the pacer, while those chats get live replies.
  Workers do not ask the backlog's turns again (they were asked before the crash).

With ``faults`` in the spec, a worker asks no more turns of a conversation whose session
the driver forgot (``forgotten-CONVERSATION``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import zlib
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.application.delivery.scheduling import AsyncioScheduler
from gateway_ledger.bootstrap import Gateway
from gateway_ledger.domain.values import LedgerPolicy, MediaItem
from gateway_ledger.entrypoints.simulation.platform import (
    PlatformBehaviour,
    ReconcilingPlatform,
    SimulatedPlatform,
)
from gateway_ledger.entrypoints.simulation.workload import Turn

BACKLOG_WAIT = 600.0
"""Seconds a backlog gateway waits for its SIGKILL before it gives up (exit 1)."""
TIME_SCALE = 0.01
"""Simulated waits are 1/100 of real ones: backoff 30 s -> 0.3 s, 120 s -> 1.2 s."""


def scaled_policy() -> LedgerPolicy:
    return LedgerPolicy(
        retry_backoff=(timedelta(seconds=30 * TIME_SCALE), timedelta(seconds=120 * TIME_SCALE)),
        max_retry_after=timedelta(seconds=15 * 60 * TIME_SCALE),
        # The platforms' windows run ten times faster (RATE_SCALE), the gateways' CPU does
        # not: a backlog drains here in about the time it would really take. The bound
        # keeps a quarter of its real length, well above a drain, so it ends stuck replies
        # (one left to a later boot sweep), not queues that move slowly.
        order_wait=timedelta(seconds=120 * ORDER_SCALE),
    )


ORDER_SCALE = 0.25
"""The simulated ``order_wait`` is 30 s (see ``scaled_policy``)."""

SHARE_PERIOD = 0.5
"""Seconds between two renewals of a gateway's share of a bot's budget (ADR 0060): runs
start and kill gateways every second or so, and a newcomer waits one period."""


def build_adapters(spec: dict[str, Any], salt: str) -> list[SimulatedPlatform]:
    """One adapter per connected platform; one that can reconcile does so unless the run
    is ``--no-reconcile`` (ADR 0050)."""
    journal_dir = Path(spec["journal_dir"])
    adapters = []
    for name, raw in spec["platforms"].items():
        if name not in spec.get("connected", spec["platforms"]):
            continue
        behaviour = PlatformBehaviour.from_dict(raw)
        reconciles = behaviour.reconcile != "none" and spec.get("reconcile", True)
        kind = ReconcilingPlatform if reconciles else SimulatedPlatform
        adapters.append(
            kind(
                name,
                journal_dir / f"{name}.db",
                behaviour,
                seed=zlib.crc32(f"{spec.get('seed', 0)}|{name}|{salt}".encode()),
            )
        )
    return adapters


def forgotten_marker(run_dir: str | Path, conversation: int) -> Path:
    """Written by ``simulate --faults`` before it erases the conversation's session."""
    return Path(run_dir) / f"forgotten-{conversation}"


async def ask(gateway: Gateway, turn: Turn) -> str:
    """The turn's reply, handed to the gateway; its outcome's status."""
    reply = Reply(
        content=turn.content,
        parts=turn.parts,
        media=tuple(MediaItem(kind="image", uri=u) for u in turn.media),
        metadata={"turn": turn.index},
    )
    context = ReplyContext(
        session_key=turn.session_key, platform=turn.platform, chat_id=turn.chat_id
    )
    outcome = await gateway.deliver(context, reply, turn.inbound_id)
    return outcome.status


async def run_conversation(gateway: Gateway, turns: list[Turn], run_dir: Path | None) -> None:
    for turn in turns:
        if run_dir is not None and forgotten_marker(run_dir, turn.conversation).exists():
            # The user was forgotten: a real gateway would open a fresh session under a
            # fresh key for any later message; this one asks no more. A turn already
            # being answered goes on: its reply may be recorded after the erasure.
            return
        await asyncio.sleep(turn.think)
        await ask(gateway, turn)


def in_backlog(spec: dict[str, Any], turn: Turn) -> bool:
    depths = spec.get("backlog")
    return depths is not None and turn.index < depths[turn.conversation]


async def record_backlog(spec: dict[str, Any]) -> int:
    """Role ``backlog``: record the backlog's turns, owed and unsent, then wait to be killed."""
    gateway = Gateway.open(spec["db"], policy=scaled_policy(), scheduler=AsyncioScheduler())
    await gateway.start(())  # no platform connected: every reply stays owed (queued)
    by_conversation: dict[int, list[Turn]] = defaultdict(list)
    for raw in spec["turns"]:
        turn = Turn.from_dict(raw)
        if in_backlog(spec, turn):
            by_conversation[turn.conversation].append(turn)
    statuses: Counter[str] = Counter()

    async def record(turns: list[Turn]) -> None:
        for turn in turns:  # in turn order: the order the chat's replies are recorded in
            statuses[await ask(gateway, turn)] += 1

    await asyncio.gather(*(record(t) for t in by_conversation.values()))
    out = Path(spec["run_dir"]) / "backlog.json"
    out.with_suffix(".tmp").write_text(json.dumps(dict(statuses)))
    out.with_suffix(".tmp").replace(out)
    await asyncio.sleep(BACKLOG_WAIT)  # the driver kills it long before
    return 1


async def main_async(spec: dict[str, Any], role: str, index: int) -> int:
    if role == "backlog":
        return await record_backlog(spec)
    scheduler = AsyncioScheduler()
    gateway = Gateway.open(
        spec["db"], policy=scaled_policy(), scheduler=scheduler, share_period=SHARE_PERIOD
    )
    adapters = build_adapters(spec, f"{role}-{index}-{os.getpid()}")
    started = Path(spec["run_dir"]) / f"started-{index}"
    if role == "worker" and spec.get("backlog") is not None:
        # With a backlog, the boot sweep's recovery is delivering already: the driver's
        # kills may land in it (a claimed backlog, half sent, claimed again).
        started.touch()
    await gateway.start(adapters)
    if role == "worker":
        if not started.exists():
            started.touch()
        by_conversation: dict[int, list[Turn]] = defaultdict(list)
        for raw in spec["turns"]:
            turn = Turn.from_dict(raw)
            if turn.conversation % spec["workers"] == index and not in_backlog(spec, turn):
                by_conversation[turn.conversation].append(turn)
        stops = Path(spec["run_dir"]) if spec.get("faults") else None
        await asyncio.gather(
            *(run_conversation(gateway, t, stops) for t in by_conversation.values())
        )
    for _ in range(2):  # statuses owed may reopen replies; their re-sends may owe more
        await asyncio.gather(*(adapter.drain() for adapter in adapters))
        await scheduler.idle()
    stats = gateway.stats()
    await gateway.close()
    for adapter in adapters:
        adapter.close()
    out = Path(spec["run_dir"]) / f"{role}-{index}-{os.getpid()}.json"
    out.write_text(
        json.dumps(
            {
                "ledger_faults": stats.ledger_faults,
                "commits": stats.commits,
                "reconcile_bad_answers": stats.reconcile_bad_answers,
            }
        )
    )
    if role == "worker":
        (Path(spec["run_dir"]) / f"done-{index}").touch()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(args[0]).read_text())
    logging.basicConfig(level=os.environ.get("GATEWAY_LEDGER_SIM_LOG", "WARNING"))
    return asyncio.run(main_async(spec, args[1], int(args[2])))


if __name__ == "__main__":
    sys.exit(main())
