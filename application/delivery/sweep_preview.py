"""What a boot sweep would do right now, without doing it (``gateway-ledger sweep``), and
the one part of it an operator's process may do: abandon what is stale or exhausted.

The preview is the real sweep (same candidates, same liveness answers, same aggregate
decisions) with its commit step replaced by a note: nothing is appended, no claim is
spent. A process with no platform adapters must never claim (a claim it cannot send
spends a recovery attempt, and a few cron runs would abandon a never-sent reply as
``max_attempts``), so :func:`abandon_stale` saves the sweep's abandon decisions only and
leaves every claim to a gateway (ADR 0029).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs

from gateway_ledger.application.delivery.ledger_ports import LedgerPort, LivenessPolicy, Loaded
from gateway_ledger.application.delivery.recovery import (
    RecoverySweep,
    SweepDecision,
    SweepResult,
)
from gateway_ledger.domain.values import OwnerIdentity, require_aware


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

    @classmethod
    def of(cls, d: SweepDecision) -> PlannedAction:
        """What the sweep decided for one obligation, in an operator's words."""
        ob = d.obligation
        if d.quarantine_reason is not None:
            action, reason = "quarantine", d.quarantine_reason.value
        elif d.abandon_reason is not None:
            action, reason = "abandon", d.abandon_reason.value
        else:
            action, reason = "claim", None
        return cls(
            obligation_id=ob.obligation_id,
            platform=ob.platform,
            action=action,
            reason=reason,
            needs_marker=d.needs_marker,
            recovery_attempt=ob.recovery_attempts,
        )


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

    def commit(self, batch: list[SweepDecision]) -> None:
        for d in batch:
            planned = PlannedAction.of(d)
            if planned.action == "quarantine":
                self.counts["quarantined"] += 1
            elif planned.action == "claim":
                self.counts["claimed"] += 1
            else:
                self.abandoned[str(planned.reason)] += 1
            self.actions.append(planned)


def preview_sweep(
    ledger: LedgerPort,
    now: datetime | None = None,
    *,
    deliverable_platforms: Collection[str] | None = None,
    liveness: LivenessPolicy | None = None,
) -> SweepPreview:
    moment = require_aware("now", now if now is not None else ledger.clock())
    sweep = _PreviewSweep(ledger, moment, deliverable_platforms, liveness or ledger.liveness)
    result, _ = sweep.run()
    return SweepPreview(result=result, actions=tuple(sweep.actions))


@attrs.frozen
class AbandonReport:
    """What ``sweep --abandon-stale`` appended (abandons only) and left to the gateways."""

    result: SweepResult
    abandoned: tuple[PlannedAction, ...]
    left_for_gateways: tuple[PlannedAction, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": False,
            "result": attrs.asdict(self.result),
            "abandoned": [a.to_dict() for a in self.abandoned],
            "left_for_gateways": [a.to_dict() for a in self.left_for_gateways],
        }


class _AbandonOnlySweep(RecoverySweep):
    """The real sweep whose claim decisions are noted and dropped, never saved: only
    abandons (stale, over ``max_attempts``) are appended, on the record, by this owner."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.left: dict[str, PlannedAction] = {}
        self.abandoned_actions: list[PlannedAction] = []

    def decide(
        self,
        obligation_id: str,
        seen_owner: OwnerIdentity,
        aggregate_id: UUID,
        loaded: Loaded | None = None,
    ) -> SweepDecision | None:
        decision = super().decide(obligation_id, seen_owner, aggregate_id, loaded)
        if decision is None or decision.abandon_reason or decision.quarantine_reason:
            return decision  # abandons and quarantines send nothing: saved
        # Claimed in memory only: dropped here, never saved (nor counted as claimed).
        self.left[decision.obligation.obligation_id] = PlannedAction.of(decision)
        return None

    def done(self, d: SweepDecision) -> None:
        super().done(d)
        self.abandoned_actions.append(PlannedAction.of(d))


def abandon_stale(
    ledger: LedgerPort,
    now: datetime | None = None,
    *,
    deliverable_platforms: Collection[str] | None = None,
    liveness: LivenessPolicy | None = None,
) -> AbandonReport:
    """Abandon the orphans the sweep would abandon (stale, or over ``max_attempts``) and
    claim nothing: what a gateway's sweep would claim is listed, left for it to send."""
    moment = require_aware("now", now if now is not None else ledger.clock())
    sweep = _AbandonOnlySweep(ledger, moment, deliverable_platforms, liveness or ledger.liveness)
    result, won = sweep.run()
    assert not won, "an abandon-only sweep never claims"
    return AbandonReport(
        result=result,
        abandoned=tuple(sweep.abandoned_actions),
        left_for_gateways=tuple(sweep.left.values()),
    )
