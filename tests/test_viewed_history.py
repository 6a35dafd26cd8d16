"""A sweep rebuilds an orphan from the events its view's catch-up has just read (ADR 0080):
``load_each(ids, viewed)`` takes an aggregate's events from that read when it holds every
version up to the one the view shows, and reads the store otherwise. What it builds is the
aggregate as of that read; a write made from it is fenced by its version, like any
other, so a change made meanwhile by another writer makes the write fail and the sweep
judge the aggregate again."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError
from recovery_support import dead_owner, record_orphans

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import OwnerIdentity

OTHER = OwnerIdentity(host="another-host", boot_id="b", pid=42, start_time=1)
"""A live sweeper elsewhere (this test's liveness says so)."""


def claimed_by_other(location: str, obligation_id: str) -> None:
    """Another gateway claims one orphan, through its own ledger and connection, on a
    thread of its own (so outside this thread's ``sharing_parses``)."""

    def claim() -> None:
        other = DeliveryLedger.open(location, owner=OTHER)
        try:
            agg = other.load(obligation_id)
            agg.claim(by=OTHER, now=other.clock(), policy=other.policy, previous_owner_gone=True)
            other.save(agg)
        finally:
            other.close()

    failed: list[BaseException] = []

    def run() -> None:
        try:
            claim()
        except BaseException as e:  # handed back to the test's thread
            failed.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def event_names(ledger: DeliveryLedger, obligation_id: str) -> list[str]:
    stored = ledger.recorder.select_events(ledger.aggregate_id(obligation_id))
    return [s.topic.rsplit(".", 1)[-1] for s in stored]


def test_an_aggregate_the_view_has_just_read_is_rebuilt_from_that_read(tmp_path: Path) -> None:
    location = str(tmp_path / "ledger.db")
    record_orphans(location, 2)
    ledger = DeliveryLedger.open(location)
    mapper: Any = ledger.private_mapper
    first, second = (ledger.aggregate_id(f"orphan-{i:05d}") for i in range(2))
    try:
        with mapper.sharing_parses():
            ledger.recoverable.catch_up()  # reads both creation events, sealed
            claimed_by_other(location, "orphan-00000")  # the store now holds version 2
            viewed = ledger.load_each([first, second], {first: 1, second: 1})
            beyond = ledger.load_each([first], {first: 2})  # more than was read: the store
        again = ledger.load_each([first], {first: 1})  # outside the block: the store
    finally:
        ledger.close()
    as_read = viewed.aggregates[first]
    assert as_read.version == 1 and as_read.owner != OTHER  # as the view read it
    assert as_read.content == "reply orphan-00000"  # opened, not the view's placeholder
    assert viewed.aggregates[second].content == "reply orphan-00001"
    assert beyond.aggregates[first].version == 2 and beyond.aggregates[first].owner == OTHER
    assert again.aggregates[first].version == 2


def test_a_write_from_what_the_view_read_is_fenced_by_the_version(tmp_path: Path) -> None:
    location = str(tmp_path / "ledger.db")
    record_orphans(location, 1)
    ledger = DeliveryLedger.open(location)
    mapper: Any = ledger.private_mapper
    aggregate_id = ledger.aggregate_id("orphan-00000")
    try:
        with mapper.sharing_parses():
            ledger.recoverable.catch_up()
            claimed_by_other(location, "orphan-00000")
            stale = ledger.load_each([aggregate_id], {aggregate_id: 1}).aggregates[aggregate_id]
        stale.claim(by=ledger.owner, now=ledger.clock(), policy=ledger.policy)
        with pytest.raises(IntegrityError):
            ledger.store_changes([stale])
        assert event_names(ledger, "orphan-00000") == ["Recorded", "Claimed"]
    finally:
        ledger.close()


def test_a_claim_made_between_the_views_read_and_the_load_is_a_lost_race(tmp_path: Path) -> None:
    """The other gateway claims one orphan after this sweep's view has read the orphans
    (from inside the sweep's liveness question, which comes between the two): the sweep's
    batch fails on that orphan's version, is redone one by one from the store, and the
    orphan is left to its new owner; every other orphan is claimed once."""
    location = str(tmp_path / "ledger.db")
    dead = dead_owner()
    ids = record_orphans(location, 6, owner=dead)
    raced = ids[3]
    asked: list[OwnerIdentity] = []

    def liveness(owner: OwnerIdentity) -> bool:
        if not asked:
            claimed_by_other(location, raced)
        asked.append(owner)
        return owner == OTHER

    sweeper = DeliveryLedger.open(location)
    try:
        won = sweeper.sweep_recoverable(liveness=liveness)
        assert sorted(item["obligation_id"] for item in won) == sorted(set(ids) - {raced})
        assert sweeper.last_sweep.claimed == 5
        assert sweeper.last_sweep.lost_races == 1
        assert event_names(sweeper, raced) == ["Recorded", "Claimed"]
        assert sweeper.load(raced).owner == OTHER
        for oid in set(ids) - {raced}:
            assert event_names(sweeper, oid) == ["Recorded", "Claimed"]
            assert sweeper.load(oid).owner == sweeper.owner
    finally:
        sweeper.close()
