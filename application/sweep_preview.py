"""What a boot sweep would do right now, without doing it (``sweep --dry-run``).

It is the real sweep (same candidates, same liveness answers, same aggregate decisions)
with its commit step replaced by a note: nothing is appended, no claim is spent.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any

import attrs

from gateway_ledger.application.recovery import (
    LivenessPolicy,
    LocalLiveness,
    RecoverySweep,
    SweepResult,
    _Decision,
)
from gateway_ledger.domain.values import require_aware

if TYPE_CHECKING:
    from gateway_ledger.application.ledger import DeliveryLedger


@attrs.frozen
class PlannedAction:
    obligation_id: str
    platform: str
    action: str  # "claim", "abandon" or "quarantine"
    reason: str | None
    needs_marker: bool
    recovery_attempt: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class SweepPreview:
    result: SweepResult
    actions: tuple[PlannedAction, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": True,
            "result": attrs.asdict(self.result),
            "actions": [a.to_dict() for a in self.actions],
        }


class _PreviewSweep(RecoverySweep):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actions: list[PlannedAction] = []

    def commit(self, batch: list[_Decision]) -> None:
        for d in batch:
            ob = d.obligation
            reason = d.abandon_reason.value if d.abandon_reason else None
            action = "claim" if reason is None else "abandon"
            if d.quarantine_reason is not None:
                action, reason = "quarantine", d.quarantine_reason.value
                self.counts["quarantined"] += 1
            elif reason is None:
                self.counts["claimed"] += 1
            else:
                self.abandoned[reason] += 1
            self.actions.append(
                PlannedAction(
                    obligation_id=ob.obligation_id,
                    platform=ob.platform,
                    action=action,
                    reason=reason,
                    needs_marker=d.needs_marker,
                    recovery_attempt=ob.recovery_attempts,
                )
            )


def preview_sweep(
    ledger: DeliveryLedger,
    now: datetime | None = None,
    *,
    deliverable_platforms: Collection[str] | None = None,
    liveness: LivenessPolicy | None = None,
) -> SweepPreview:
    moment = require_aware("now", now if now is not None else ledger.clock())
    sweep = _PreviewSweep(ledger, moment, deliverable_platforms, liveness or LocalLiveness())
    result, _ = sweep.run()
    return SweepPreview(result=result, actions=tuple(sweep.actions))
