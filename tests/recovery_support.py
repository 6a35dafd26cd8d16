"""Helpers for the recovery tests: dead owners, orphaned obligations, real child processes."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import textwrap
from typing import Any

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import boot_id

_dead_pids = itertools.count(900_000_000)


def dead_owner() -> OwnerIdentity:
    """An owner on this host and boot whose pid cannot exist (above any pid_max)."""
    return OwnerIdentity(
        host=socket.gethostname(), boot_id=boot_id(), pid=next(_dead_pids), start_time=1
    )


def record_orphans(
    location: str,
    count: int,
    *,
    prefix: str = "orphan",
    platform: str = "telegram",
    owner: OwnerIdentity | None = None,
    batch: int = 250,
) -> list[str]:
    """Obligations left pending by a dead owner, written in a few batched saves."""
    ledger = DeliveryLedger.open(location, owner=owner or dead_owner())
    ids = [f"{prefix}-{i:05d}" for i in range(count)]
    try:
        for start in range(0, count, batch):
            aggregates = [
                ledger.new_obligation(
                    obligation_id=oid,
                    session_key=f"agent:main:{platform}:dm:{i}",
                    platform=platform,
                    chat_id=str(i),
                    content=f"reply {oid}",
                    reply_to=f"m{i}",
                )
                for i, oid in enumerate(ids[start : start + batch], start)
            ]
            ledger.save(*aggregates)
    finally:
        ledger.close()
    return ids


def python_child(script: str, **kwargs: Any) -> subprocess.Popen[str]:
    """A real child interpreter running ``script`` (dedented), pipes in text mode.

    ``kwargs`` go to Popen and may replace a pipe (``stderr=<file>``, for instance).
    """
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], text=True, **{**pipes, **kwargs}
    )


def view_snapshot(ledger: DeliveryLedger) -> list[tuple[Any, ...]]:
    """The view's rows as comparable tuples (instants, not tz objects)."""
    return [
        (
            e.obligation_id,
            e.aggregate_id,
            e.state,
            e.platform,
            e.owner,
            e.recovery_attempts,
            e.recorded_at.timestamp(),
            e.last_transition_at.timestamp(),
            e.version,
        )
        for e in ledger.recoverable.entries()
    ]


def truth_snapshot(ledger: DeliveryLedger, obligation_ids: list[str]) -> dict[str, tuple[Any, ...]]:
    """What the aggregates say about the unresolved ones, in the view's terms."""
    truth = {}
    for oid in obligation_ids:
        status = ledger.get(oid)
        if status.state in ("delivered", "abandoned"):
            continue
        truth[oid] = (status.state, status.owner, status.recovery_attempts, status.version)
    return truth
