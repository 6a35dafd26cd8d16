"""Fake platform adapters for gateway tests: they journal every message they receive."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.delivery.ports import AdapterBase, SendResult
from gateway_ledger.domain.values import DeliveryTarget, MediaItem, OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import boot_id, current_owner


@attrs.define
class Sent:
    target: DeliveryTarget
    content: str
    reply_to: str | None
    media: tuple[MediaItem, ...]
    idempotency_key: str | None


class ScriptedAdapter(AdapterBase):
    """Answers each send with the next scripted result (an exception is raised);
    ``"hang"`` never answers (a crash mid-send is then a cancelled task)."""

    def __init__(
        self, platform: str = "telegram", script: Sequence[Any] = (), *, idempotent: bool = False
    ) -> None:
        self.platform = platform
        self.supports_idempotency = idempotent
        self.script = list(script)
        self.sent: list[Sent] = []
        self.arrived: list[Sent] = []  # what a user would see (not the hung or raised-before)

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
        sent = Sent(target, content, reply_to, tuple(media), idempotency_key)
        self.sent.append(sent)
        step = self.script.pop(0) if self.script else SendResult.ok(f"m{len(self.sent)}")
        if step == "hang":
            self.arrived.append(sent)
            await asyncio.Event().wait()
        if isinstance(step, BaseException):
            raise step
        if step.success:
            self.arrived.append(sent)
        return step


def dead_owner() -> OwnerIdentity:
    """This host and boot, a pid that is not running with that start time: provably dead."""
    me = current_owner()
    return OwnerIdentity(host=me.host, boot_id=boot_id(), pid=me.pid, start_time=1)


class MemorySessions:
    """The resume seam of a session store, kept in memory (until issue 4's store lands)."""

    def __init__(self, interrupted: Sequence[str]) -> None:
        self.interrupted = set(interrupted)
        self.calls: list[str] = []

    def clear_resume(self, session_key: str, now: datetime) -> None:
        self.calls.append(f"clear {session_key}")
        self.interrupted.discard(session_key)

    def pending_resumes(self, now: datetime) -> list[str]:
        self.calls.append("pending")
        return sorted(self.interrupted)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
