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
from typing import TYPE_CHECKING

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.domain.values import ErrorClass

if TYPE_CHECKING:
    from gateway_ledger.application.delivery.ledger import DeliveryLedger

log = logging.getLogger("gateway_ledger.late_results")

Result = DeliveryObligation.Delivered | DeliveryObligation.Failed | DeliveryObligation.PartDelivered
RESULT_EVENTS = (
    DeliveryObligation.Delivered,
    DeliveryObligation.Failed,
    DeliveryObligation.PartDelivered,
)
_ATTEMPTS = 3


def results_of(events: Sequence[object]) -> list[Result]:
    return [e for e in events if isinstance(e, RESULT_EVENTS)]


def _reapply(obligation: DeliveryObligation, result: Result) -> None:
    """The command that produced ``result``, run again with the fence its send started
    under: on a claimed obligation the aggregate records it as late."""
    if isinstance(result, DeliveryObligation.Delivered):
        obligation.confirm_delivery(
            by=result.by, now=result.timestamp, receipt=result.receipt, fence=result.fence
        )
    elif isinstance(result, DeliveryObligation.PartDelivered):
        obligation.acknowledge_part(
            by=result.by,
            now=result.timestamp,
            index=result.index,
            receipt=result.receipt,
            fence=result.fence,
        )
    else:
        obligation.fail(
            by=result.by,
            now=result.timestamp,
            error=result.error,
            classification=ErrorClass(result.classification),
            retry_after=result.retry_after,
            fence=result.fence,
        )


def record_results(ledger: DeliveryLedger, obligation_id: str, results: Sequence[Result]) -> int:
    """Re-apply result events on the current aggregate; returns how many were late.

    Raises IllegalTransition when a result is neither legal nor fenced out (then it was not
    a claim that won: an operator resolved it, say), ConcurrentUpdate after repeated races.
    """
    for attempt in range(_ATTEMPTS):
        obligation = ledger.load(obligation_id)
        for result in results:
            _reapply(obligation, result)
        late = sum(
            1
            for p in obligation.pending_events
            if isinstance(p, DeliveryObligation.LateResultReported)
        )
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
