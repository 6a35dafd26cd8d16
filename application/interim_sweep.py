"""A stand-in recovery sweep, used only while the ledger has no ``sweep_recoverable``.

It follows the upstream order (owner alive -> skip; over the claim cap or stale ->
abandon; platform offline -> skip, nothing spent; else claim) and the aggregate version
is the lock, exactly like the real sweep, but it scans the whole notification log instead
of an index of outstanding work: O(history). The projection-backed sweep replaces it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.persistence import IntegrityError

from gateway_ledger.application.views import plain
from gateway_ledger.domain.obligation import DeliveryObligation
from gateway_ledger.domain.values import UNRESOLVED_STATES, AbandonReason
from gateway_ledger.infrastructure.process_identity import is_alive_locally

if TYPE_CHECKING:
    from gateway_ledger.application.ledger import DeliveryLedger

log = logging.getLogger("gateway_ledger.interim_sweep")

_RECORDED_TOPIC_SUFFIX = "DeliveryObligation.Recorded"


def obligation_ids(ledger: DeliveryLedger) -> list[UUID]:
    ids: list[UUID] = []
    start = 0
    while True:
        batch = ledger.recorder.select_notifications(start, 1000, inclusive_of_start=False)
        if not batch:
            return ids
        for n in batch:
            if n.topic.endswith(_RECORDED_TOPIC_SUFFIX):
                ids.append(UUID(str(n.originator_id)))
        start = batch[-1].id


def interim_sweep(
    ledger: DeliveryLedger,
    now: datetime | None = None,
    *,
    deliverable_platforms: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    now = now or ledger.clock()
    won: list[dict[str, Any]] = []
    for uuid in obligation_ids(ledger):
        agg: DeliveryObligation = ledger.repository.get(uuid)
        if agg.state not in UNRESOLVED_STATES or agg.owner == ledger.owner:
            continue
        if agg.owner.host == ledger.owner.host and is_alive_locally(agg.owner):
            continue
        if agg.owner.host != ledger.owner.host:
            continue  # other hosts: leases decide (multi-host issue); treated as alive
        try:
            if agg.recovery_attempts >= ledger.policy.max_attempts:
                agg.abandon(reason=AbandonReason.MAX_ATTEMPTS, now=now, by=ledger.owner)
                ledger.save(agg)
                continue
            if ledger.policy.is_stale(agg.recorded_at, now):
                agg.abandon(reason=AbandonReason.STALE, now=now, by=ledger.owner)
                ledger.save(agg)
                continue
            if deliverable_platforms is not None and agg.platform not in deliverable_platforms:
                continue
            agg.claim(by=ledger.owner, now=now, policy=ledger.policy)
            ledger.save(agg)
        except IntegrityError:
            log.info("obligation %s taken by another sweeper", agg.obligation_id)
            continue
        except Exception as e:  # one bad write must not hide the rest of the work
            log.warning("sweep of %s failed: %s", agg.obligation_id, type(e).__name__)
            continue
        won.append(
            {
                "obligation_id": agg.obligation_id,
                "session_key": agg.session_key,
                "platform": agg.platform,
                "chat_id": agg.target.chat_id,
                "thread_id": agg.target.thread_id,
                "content": agg.content,
                "needs_marker": agg.arrived_before_this_send,
                "attempts": agg.recovery_attempts,
                "reply_to": agg.target.reply_to,
                "media": plain(agg.media),
                "metadata": dict(agg.metadata),
            }
        )
    return won
