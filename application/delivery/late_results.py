"""Results that lost to a claim: recorded as late facts, never as transitions (ADR 0010).

A gateway that was paused (or partitioned) past its lease may finish a send after another
gateway claimed the obligation. Its ``Delivered``/``Failed``/``PartDelivered`` then fails
to append (the claim took that version). The result is still true, so it is re-applied on
the current aggregate with the fence the send started under: the aggregate, seeing a stale
fence, records ``LateResultReported(late=True)`` and leaves the state to the new owner.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.domain.values import ErrorClass

if TYPE_CHECKING:
    from gateway_ledger.application.delivery.ledger import DeliveryLedger

log = logging.getLogger("gateway_ledger.late_results")

RESULT_EVENTS = frozenset({"Delivered", "Failed", "PartDelivered"})
_ATTEMPTS = 3


def results_of(events: Sequence[Any]) -> list[Any]:
    return [e for e in events if type(e).__name__ in RESULT_EVENTS]


def record_results(ledger: DeliveryLedger, obligation_id: str, results: Sequence[Any]) -> int:
    """Re-apply result events on the current aggregate; returns how many were late.

    Raises IllegalTransition when a result is neither legal nor fenced out (then it was not
    a claim that won: an operator resolved it, say), ConcurrentUpdate after repeated races.
    """
    for attempt in range(_ATTEMPTS):
        obligation = ledger.load(obligation_id)
        for e in results:
            kind = type(e).__name__
            if kind == "Delivered":
                obligation.confirm_delivery(
                    by=e.by, now=e.timestamp, receipt=e.receipt, fence=e.fence
                )
            elif kind == "PartDelivered":
                obligation.acknowledge_part(
                    by=e.by, now=e.timestamp, index=e.index, receipt=e.receipt, fence=e.fence
                )
            else:
                obligation.fail(
                    by=e.by,
                    now=e.timestamp,
                    error=e.error,
                    classification=ErrorClass(e.classification),
                    retry_after=e.retry_after,
                    fence=e.fence,
                )
        late = sum(1 for p in obligation.pending_events if type(p).__name__ == "LateResultReported")
        try:
            ledger.save_transition(obligation, "late result" if late else "result")
        except ConcurrentUpdate:
            if attempt == _ATTEMPTS - 1:
                raise
            continue
        if late:
            log.warning(
                "obligation %s: %d late result(s) recorded from a fenced-out owner (fence %s < %d)",
                obligation_id,
                late,
                results[0].fence,
                obligation.fence,
            )
        return late
    return 0
