"""Helpers for the operators' tests: crafted histories planted through the aggregate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity
from gateway_ledger.infrastructure.ownership.process_identity import current_owner

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def owner(pid: int) -> OwnerIdentity:
    """An owner on this host whose process does not exist (the sweep may take its work)."""
    me = current_owner()
    return OwnerIdentity(
        host=me.host, boot_id=me.boot_id, pid=pid, start_time=1, installation_id=""
    )


def record(ledger: DeliveryLedger, oid: str, key: str = "agent:main:telegram:dm:42") -> str:
    ledger.record_obligation(
        obligation_id=oid, session_key=key, platform="telegram", chat_id="42", content="hello"
    )
    return oid


def plant_late_delivery(location: str, oid: str = "planted-late") -> str:
    """Attempt by A, A 'crashes', B claims and re-sends, then A's Delivered lands too."""
    a, b = owner(4_000_001), owner(4_000_002)
    first = DeliveryLedger.open(location, owner=a)
    record(first, oid)
    first.mark_attempting(oid)
    agg = first.load(oid)
    agg.claim(by=b, now=T0 + timedelta(seconds=5), policy=LedgerPolicy())
    first.save(agg)
    agg = first.load(oid)
    agg.confirm_delivery(by=a, now=T0 + timedelta(seconds=6), receipt=["m-1"])
    first.save(agg)
    first.close()
    return oid


def plant_unmarked_resend(location: str, oid: str = "planted-unmarked") -> str:
    """An ambiguous failure (may have arrived), then a claim that says no marker is needed."""
    a, b = owner(4_000_003), owner(4_000_004)
    ledger = DeliveryLedger.open(location, owner=a)
    record(ledger, oid)
    ledger.mark_attempting(oid)
    ledger.mark_failed(oid, "timeout after the request left", "ambiguous")
    agg = ledger.load(oid)
    agg.trigger_event(  # a forged claim: no guard would let it through
        DeliveryObligation.Claimed,
        by=b,
        previous_owner=agg.owner,
        recovery_attempt=1,
        needs_marker=False,
        fence=agg.fence + 1,
        timestamp=T0 + timedelta(seconds=9),
    )
    ledger.save(agg)
    agg = ledger.load(oid)
    agg.confirm_delivery(by=b, now=T0 + timedelta(seconds=10), receipt=["m-2"])
    ledger.save(agg)
    ledger.close()
    return oid
