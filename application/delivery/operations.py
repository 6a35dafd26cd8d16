"""What operators ask of a ledger: figures, lists, a past state, a retry.

Figures and lists come from the obligation index (a projection, caught up first), so
their cost follows the number of obligations, never the number of events. Only
``timeline`` replays, and only the events of one obligation.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.delivery.ledger_ports import LedgerPort
from gateway_ledger.application.delivery.measures import LATENCY_BUCKETS, Buckets
from gateway_ledger.application.delivery.views import HistoryEntry, ObligationStatus
from gateway_ledger.application.observability import causes, tracing
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.delivery.reconciliation import PlatformStatus
from gateway_ledger.domain.errors import InvalidInput, NotFound
from gateway_ledger.domain.values import (
    QUARANTINED,
    AbandonReason,
    ObligationState,
    require_aware,
    require_choice,
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
NO_DELIVERIES = Buckets(LATENCY_BUCKETS, (0,) * (len(LATENCY_BUCKETS) + 1), 0.0)
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
    failed_after_acceptance: int = 0
    """Sends the platforms dropped after accepting them; each reopened its obligation
    (ADR 0050)."""
    by_platform_status: dict[str, int] = attrs.field(factory=dict)
    """Delivered obligations by the last status their platform reported (``read``,
    ``delivered_to_device``)."""
    delivery_histogram: Buckets = NO_DELIVERIES
    """Record to delivery as a histogram (``LATENCY_BUCKETS``), from the same read, for
    ``LedgerCollector`` (not in ``to_dict``: ``status --json`` is unchanged)."""

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=True)
        data["generated_at"] = self.generated_at.isoformat()
        del data["delivery_histogram"]  # the metrics' (its buckets are not status figures)
        return data


def compute_stats(ledger: LedgerPort, now: datetime | None = None) -> LedgerStats:
    moment = require_aware("now", now if now is not None else ledger.clock())
    index = ledger.obligation_index
    index.catch_up()
    tally = index.tally(max_quarantined_ids=MAX_QUARANTINED_IDS, latency_bounds=LATENCY_BUCKETS)
    by_state = dict.fromkeys(STATES, 0)
    by_platform: dict[str, dict[str, int]] = {}
    claims = claimed = retries = failed_after = 0
    by_status = {
        s.value: 0 for s in PlatformStatus if s is not PlatformStatus.FAILED_AFTER_ACCEPTANCE
    }
    for group in tally.groups:
        failed_after += group.failed_after_acceptance
        by_status[PlatformStatus.READ] += group.read
        by_status[PlatformStatus.DELIVERED_TO_DEVICE] += group.delivered_to_device
        by_state[group.state] = by_state.get(group.state, 0) + group.obligations
        per = by_platform.setdefault(group.platform, dict.fromkeys(STATES, 0))
        per[group.state] = per.get(group.state, 0) + group.obligations
        claims += group.claims
        claimed += group.claimed
        retries += group.retries
    reasons = {r.value: 0 for r in AbandonReason}
    reasons.update(tally.abandoned_by_reason)
    oldest = tally.oldest_unresolved
    quarantined_ids = tally.quarantined_ids
    age = None
    if oldest is not None:
        age = round(max(0, to_micros(moment) - to_micros(oldest[1])) / 1e6, 3)
    delivery = tally.delivery
    times = DeliveryTimes(
        count=delivery.count,
        p50=delivery.p50,
        p95=delivery.p95,
        max=delivery.max,
        total=delivery.total,
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
        failed_after_acceptance=failed_after,
        by_platform_status={str(s): n for s, n in by_status.items()},
        delivery_histogram=Buckets(LATENCY_BUCKETS, delivery.cumulative, delivery.total),
    )


def list_obligations(
    ledger: LedgerPort,
    *,
    state: str | None = None,
    platform: str | None = None,
    since: datetime | None = None,
    session: str | None = None,
    limit: int | None = None,
    status: str | None = None,
) -> tuple[IndexEntry, ...]:
    """Obligations from the index, oldest first; ``session`` is a session key (hashed here);
    ``status``: the last status their platform reported (ADR 0050)."""
    if state is not None and state not in STATES:
        raise InvalidInput(f"unknown state {state!r} (one of {', '.join(STATES)})")
    if status is not None:
        status = str(require_choice("platform status", status, PlatformStatus).value)
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
        state=state,
        platform=platform,
        platform_status=status,
        recorded_since=since,
        subject_id=subject_id,
        limit=limit,
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
    with (
        tracing.span("operator_retry", obligation_id=obligation_id, command="retry"),
        causes.caused_by(f"operator:retry:{by_operator or '-'}", correlation_id=causes.new_id()),
    ):
        obligation = ledger.change(
            obligation_id,
            "retry requested",
            lambda o: o.request_retry(
                by=ledger.owner, now=ledger.clock(), requested_by=by_operator
            ),
        )
    log.info(
        "obligation %s retry requested (fence %d, marker %s)",
        obligation_id,
        obligation.fence,
        obligation.needs_marker,
    )
    return ObligationStatus.of(obligation)
