"""What operators ask of a ledger: figures, lists, a past state, a retry.

Figures and lists come from the obligation index (a projection, caught up first), so
their cost follows the number of obligations, never the number of events. Only
``timeline`` replays, and only the events of one obligation.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.delivery.ledger_ports import LedgerPort
from gateway_ledger.application.delivery.views import HistoryEntry, ObligationStatus
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import InvalidInput, NotFound
from gateway_ledger.domain.values import (
    QUARANTINED,
    AbandonReason,
    ObligationState,
    require_aware,
    require_clear_text,
    require_text,
)
from gateway_ledger.projections.delivery.catalog import (
    PROJECTION_NAMES,
    ProjectionStatus,
    projection_status,
)
from gateway_ledger.projections.delivery.obligation_index import (
    UNRESOLVED,
    IndexEntry,
    IndexQuery,
)
from gateway_ledger.projections.delivery.obligation_view import to_micros

log = logging.getLogger("gateway_ledger.operations")

STATES: tuple[str, ...] = (*(s.value for s in ObligationState), QUARANTINED)
"""The index's states: the aggregate's, and ``quarantined`` (ADR 0027)."""
MAX_QUARANTINED_IDS = 1000
"""``stats().quarantined_ids`` lists at most this many (oldest first); the count is exact."""


@attrs.frozen
class DeliveryTimes:
    """Seconds from record to delivery over every delivered obligation."""

    count: int
    p50: float | None
    p95: float | None
    max: float | None
    total: float


@attrs.frozen
class LedgerStats:
    """The figures of ``gateway-ledger status`` and ``metrics``; stable field names."""

    generated_at: datetime
    total: int
    by_state: dict[str, int]
    by_platform: dict[str, dict[str, int]]
    unresolved: int
    oldest_unresolved_id: str | None
    oldest_unresolved_age_seconds: float | None
    abandoned_by_reason: dict[str, int]
    delivery_seconds: DeliveryTimes
    recovery_claims: int
    obligations_claimed: int
    operator_retries: int
    quarantined: int
    """Obligations with an event this version cannot read: not claimed, not sent, not
    counted as delivered (ADR 0027)."""
    quarantined_ids: tuple[str, ...]
    log_position: int
    projections: tuple[ProjectionStatus, ...]

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=True)
        data["generated_at"] = self.generated_at.isoformat()
        return data


def _percentile(ordered: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        return None
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def compute_stats(ledger: LedgerPort, now: datetime | None = None) -> LedgerStats:
    moment = require_aware("now", now if now is not None else ledger.clock())
    index = ledger.obligation_index
    index.catch_up()
    tally = index.tally(max_quarantined_ids=MAX_QUARANTINED_IDS)
    by_state = dict.fromkeys(STATES, 0)
    by_platform: dict[str, dict[str, int]] = {}
    claims = claimed = retries = 0
    for group in tally.groups:
        by_state[group.state] = by_state.get(group.state, 0) + group.obligations
        per = by_platform.setdefault(group.platform, dict.fromkeys(STATES, 0))
        per[group.state] = per.get(group.state, 0) + group.obligations
        claims += group.claims
        claimed += group.claimed
        retries += group.retries
    reasons = {r.value: 0 for r in AbandonReason}
    reasons.update(tally.abandoned_by_reason)
    oldest = tally.oldest_unresolved
    durations = list(tally.delivery_seconds)
    quarantined_ids = tally.quarantined_ids
    age = None
    if oldest is not None:
        age = round(max(0, to_micros(moment) - to_micros(oldest[1])) / 1e6, 3)
    times = DeliveryTimes(
        count=len(durations),
        p50=_percentile(durations, 0.50),
        p95=_percentile(durations, 0.95),
        max=durations[-1] if durations else None,
        total=round(sum(durations), 6),
    )
    unresolved = sum(by_state[s] for s in UNRESOLVED)
    return LedgerStats(
        generated_at=moment,
        total=sum(by_state.values()),
        by_state=by_state,
        by_platform=dict(sorted(by_platform.items())),
        unresolved=unresolved,
        oldest_unresolved_id=None if oldest is None else oldest[0],
        oldest_unresolved_age_seconds=age,
        abandoned_by_reason=reasons,
        delivery_seconds=times,
        recovery_claims=claims,
        obligations_claimed=claimed,
        operator_retries=retries,
        quarantined=by_state[QUARANTINED],
        quarantined_ids=quarantined_ids,
        log_position=ledger.recorder.max_notification_id() or 0,
        projections=tuple(projection_status(ledger, name) for name in PROJECTION_NAMES),
    )


def list_obligations(
    ledger: LedgerPort,
    *,
    state: str | None = None,
    platform: str | None = None,
    since: datetime | None = None,
    session: str | None = None,
    limit: int | None = None,
) -> tuple[IndexEntry, ...]:
    """Obligations from the index, oldest first; ``session`` is a session key (hashed here)."""
    if state is not None and state not in STATES:
        raise InvalidInput(f"unknown state {state!r} (one of {', '.join(STATES)})")
    if platform is not None:
        platform = require_clear_text("platform", platform)
    if since is not None:
        since = require_aware("since", since)
    subject_id = None
    if session is not None:
        require_text("session", session)
        subject_id = ledger.private_mapper.keyring.subject_id(session)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidInput("limit must be a non-negative int")
    index = ledger.obligation_index
    index.catch_up()
    query = IndexQuery(
        state=state, platform=platform, recorded_since=since, subject_id=subject_id, limit=limit
    )
    return tuple(index.entries(query))


@attrs.frozen
class Timeline:
    """One obligation's events up to ``at`` and its state at that moment."""

    obligation_id: str
    at: datetime | None
    entries: tuple[HistoryEntry, ...]
    status: ObligationStatus
    later_events: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "obligation_id": self.obligation_id,
            "at": None if self.at is None else self.at.isoformat(),
            "status": self.status.to_dict(),
            "history": [e.to_dict() for e in self.entries],
            "later_events": self.later_events,
        }


def timeline(ledger: LedgerPort, obligation_id: str, at: datetime | None = None) -> Timeline:
    """Replay one obligation's events up to ``at`` (all of them when None)."""
    events: list[Any] = list(ledger.events.get(ledger.aggregate_id(obligation_id)))
    return timeline_of(obligation_id, events, at)


def timeline_of(obligation_id: str, events: list[Any], at: datetime | None = None) -> Timeline:
    """The timeline of one obligation's events (from the store, or from an archive)."""
    if at is not None:
        require_aware("at", at)
    if not events:
        raise NotFound("obligation", obligation_id)
    kept = [e for e in events if at is None or e.timestamp <= at]
    if not kept:
        when = at.isoformat() if at else ""
        raise InvalidInput(f"obligation {obligation_id} was not recorded yet at {when}")
    aggregate: Any = None
    for e in kept:
        aggregate = e.mutate(aggregate)
    assert isinstance(aggregate, DeliveryObligation)
    return Timeline(
        obligation_id=obligation_id,
        at=at,
        entries=tuple(HistoryEntry.of(e) for e in kept),
        status=ObligationStatus.of(aggregate),
        later_events=len(events) - len(kept),
    )


def request_retry(ledger: LedgerPort, obligation_id: str, by_operator: str) -> ObligationStatus:
    """Append ``RetryRequested``; refused (IllegalTransition) on a final obligation."""
    require_clear_text("by_operator", by_operator, allow_empty=True)
    obligation = ledger.change(
        obligation_id,
        "retry requested",
        lambda o: o.request_retry(by=ledger.owner, now=ledger.clock(), requested_by=by_operator),
    )
    log.info(
        "obligation %s retry requested (fence %d, marker %s)",
        obligation_id,
        obligation.fence,
        obligation.needs_marker,
    )
    return ObligationStatus.of(obligation)
