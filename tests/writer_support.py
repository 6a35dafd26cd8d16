"""Shared by the group-commit writer's tests: one obligation's pending events."""

from __future__ import annotations

from gateway_ledger.bootstrap import DeliveryLedger


def events(ledger: DeliveryLedger, oid: str) -> list[object]:
    """The ``Recorded`` event of a new obligation ``oid``, not saved."""
    agg = ledger.new_obligation(
        obligation_id=oid, session_key="agent:main:cli:dm:1", platform="cli", chat_id="1",
        content="hi",
    )  # fmt: skip
    return list(agg.collect_events())
