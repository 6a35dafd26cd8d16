"""Decoding many events reads their data keys in one query (sweeps, catch-ups, bulk loads)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.bulk_events import (
    load_aggregates,
    select_stored_events,
)


def record(ledger: DeliveryLedger, sessions: int) -> list[UUID]:
    ids = []
    for i in range(sessions):
        oid = f"o-{i}"
        ledger.record_obligation(
            obligation_id=oid, session_key=f"agent:main:telegram:dm:{i}",
            platform="telegram", chat_id=str(i), content=f"reply {i}", reply_to=f"m-{i}",
        )  # fmt: skip
        ledger.mark_attempting(oid)
        ids.append(ledger.aggregate_id(oid))
    return ids


def test_twenty_sessions_cost_one_key_read_and_decode_as_one_by_one(store_location: str) -> None:
    record(DeliveryLedger.open(store_location), 20)
    ledger = DeliveryLedger.open(store_location)  # a new process's view: no key cached
    ledger.forget_session("agent:main:telegram:dm:3")  # an erased subject among them
    ids = [ledger.aggregate_id(f"o-{i}") for i in range(20)]
    table: Any = ledger.mapper.keyring.table
    reads: list[str] = []
    for name in ("get", "get_many", "find"):
        real = getattr(table, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            reads.append(_name)
            return _real(*args)

        setattr(table, name, counted)
    loaded = load_aggregates(ledger, ids)
    assert reads == ["get_many"]
    assert loaded[ids[5]].content == "reply 5" and loaded[ids[5]].target.reply_to == "m-5"
    assert loaded[ids[3]].content == "[erased]"  # its key is gone: placeholders remain

    # The same events decoded one at a time, by a mapper with nothing cached, agree.
    fresh = DeliveryLedger.open(store_location)
    stored = [s for events in select_stored_events(fresh, ids).values() for s in events]
    one_by_one = [fresh.mapper.to_domain_event(s) for s in stored]
    batched = ledger.mapper.to_domain_events(stored)
    assert [e.__dict__ for e in batched] == [e.__dict__ for e in one_by_one]
    for opened in (ledger, fresh):
        opened.close()
