"""A sweep parses each orphan's stored bytes once (``PrivateMapper.sharing_parses``): the
view's sealed read leaves its parse for the load, which opens what the view left sealed.
The load must get exactly what its own parse would give, whatever the view did with its
copy, and only for the very same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eventsourcing.persistence import StoredEvent
from recovery_support import dead_owner

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED, UNREADABLE


def recorded(tmp_path: Path) -> tuple[DeliveryLedger, list[StoredEvent]]:
    ledger = DeliveryLedger.open(str(tmp_path / "ledger.db"))
    for oid, text in (("o1", "the first reply"), ("o2", "the second reply")):
        ledger.record_obligation(
            obligation_id=oid,
            session_key=f"agent:main:telegram:dm:{oid}",
            platform="telegram",
            chat_id="1",
            content=text,
        )
        agg = ledger.load(oid)
        agg.start_attempt(by=ledger.owner, now=ledger.clock())
        ledger.save(agg)
    return ledger, list(ledger.recorder.select_events(ledger.aggregate_id("o1")))


def fields(event: Any) -> dict[str, Any]:
    return dict(vars(event))


def test_the_next_reader_gets_what_its_own_parse_gives(tmp_path: Path) -> None:
    ledger, stored = recorded(tmp_path)
    mapper: Any = ledger.mapper
    alone = [mapper.to_domain_event(s) for s in stored]
    assert alone[0].content == "the first reply"
    with mapper.sharing_parses():
        with mapper.sealed():
            viewed = [mapper.to_domain_event(s) for s in stored]  # a view's read
        loaded = [mapper.to_domain_event(s) for s in stored]  # the load's, from the view's parse
        again = [mapper.to_domain_event(s) for s in stored]  # the entry is gone: parsed afresh
    assert viewed[0].content == ERASED  # the view never holds the text
    assert [fields(e) for e in loaded] == [fields(e) for e in alone]
    assert [fields(e) for e in again] == [fields(e) for e in alone]
    assert all(a is not b and vars(a) is not vars(b) for a, b in zip(viewed, loaded, strict=True))


def test_other_bytes_under_the_same_version_are_parsed_as_they_are(tmp_path: Path) -> None:
    """A row read again with other bytes (rewritten, damaged) is not answered from the
    parse of the bytes read before."""
    ledger, stored = recorded(tmp_path)
    mapper: Any = ledger.mapper
    other = next(iter(ledger.recorder.select_events(ledger.aggregate_id("o2"))))
    swapped = StoredEvent(
        originator_id=stored[0].originator_id,
        originator_version=stored[0].originator_version,
        topic=other.topic,
        state=other.state,  # o2's sealed fields, authenticated for o2 only
    )
    outside = mapper.to_domain_event(swapped)
    with mapper.sharing_parses():
        with mapper.sealed():
            mapper.to_domain_event(stored[0])
        inside = mapper.to_domain_event(swapped)
    assert inside.content == outside.content == UNREADABLE
    assert fields(inside) == fields(outside)


def test_a_sweep_that_shares_its_parses_claims_the_replies_text(tmp_path: Path) -> None:
    """The sweep's claims carry the replies' text as recorded: the load opened the parses
    the view's catch-up left sealed, and no placeholder reached a claim."""
    location = str(tmp_path / "ledger.db")
    dead = DeliveryLedger.open(location, owner=dead_owner())
    texts = {f"o{i}": f"reply {i} to chat {i % 3}" for i in range(40)}
    for oid, text in texts.items():
        dead.record_obligation(
            obligation_id=oid,
            session_key=f"agent:main:telegram:dm:{oid}",
            platform="telegram",
            chat_id=oid,
            content=text,
        )
    dead.close()
    sweeper = DeliveryLedger.open(location)
    won = sweeper.sweep_recoverable()
    assert {item["obligation_id"]: item["content"] for item in won} == texts
    assert sweeper.last_sweep.claimed == len(texts)
