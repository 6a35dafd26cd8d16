"""The SQLite write without new key rows is one statement, its own transaction, and the
groups it writes are cut at the size its recorder asks for (ADRs 0074, 0077).

``INSERT ... SELECT`` of the rows (beyond ``ROWS_BUCKET`` of them, padded with rows of
NULLs to a multiple of it), kept only if every used key is still stored: these tests hold it to
what the transaction it replaces did. Every row lands, byte for byte, and no padding
row; a clash of (aggregate, version) writes none of them; a used key that is gone
writes none and is named by ``SessionErased``; a write larger than one statement takes
goes as a transaction, whole.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import SessionErased
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.eventstore.keyed_recorder import ROWS_BUCKET
from gateway_ledger.infrastructure.privacy.keyring import WriteKeys
from tests.writer_support import events as writer_events

KEY = "agent:main:telegram:dm:5150"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[DeliveryLedger]:
    opened = DeliveryLedger.open(tmp_path / "ledger.db")
    yield opened
    opened.close()


def events(count: int, *, stream: uuid.UUID | None = None) -> list[StoredEvent]:
    """``count`` stored events, each of its own aggregate unless ``stream`` is given."""
    return [
        StoredEvent(
            originator_id=stream or uuid.uuid4(),
            originator_version=n + 1 if stream else 1,
            topic="tests.test_one_statement_write:Event",
            state=f'{{"n":{n}}}'.encode(),
        )
        for n in range(count)
    ]


def stored(ledger: DeliveryLedger) -> list[tuple[str, int, bytes]]:
    path = ledger.recorder.datastore.pool.db_name
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT originator_id, originator_version, state FROM stored_events "
            "WHERE topic = 'tests.test_one_statement_write:Event' ORDER BY rowid"
        ).fetchall()
    conn.close()
    return rows


def write(ledger: DeliveryLedger, batch: list[StoredEvent], keys: WriteKeys | None = None) -> None:
    ledger.recorder.insert_events(batch, keys=keys, notification_ids=False)


@pytest.mark.parametrize("count", [1, ROWS_BUCKET - 1, ROWS_BUCKET, ROWS_BUCKET + 1, 50])
def test_every_row_lands_whole_and_no_padding_row_does(ledger: DeliveryLedger, count: int) -> None:
    batch = events(count)
    write(ledger, batch)
    assert stored(ledger) == [(e.originator_id.hex, 1, e.state) for e in batch]


def test_a_write_of_no_events_writes_nothing_and_raises_nothing(ledger: DeliveryLedger) -> None:
    write(ledger, [])
    assert stored(ledger) == []


def test_a_clash_of_versions_writes_none_of_the_rows(ledger: DeliveryLedger) -> None:
    stream = uuid.uuid4()
    write(ledger, events(2, stream=stream))
    clash = events(3)[:2] + events(3, stream=stream)[2:]  # versions 3 of the stream: free
    clash += events(1, stream=stream)  # version 1 of the stream: taken
    with pytest.raises(IntegrityError):
        write(ledger, clash)
    assert len(stored(ledger)) == 2  # the first write only


def test_a_used_key_that_is_gone_writes_nothing_and_is_named(ledger: DeliveryLedger) -> None:
    ledger.record_obligation(
        obligation_id="o-1", session_key=KEY, platform="telegram", chat_id="5150", content="hi"
    )
    ring = ledger.private_mapper.keyring
    subject = ring.subject_id(KEY)
    (key_id, _), *_ = ring.table.get_many([subject]).values()

    live = WriteKeys()
    live.used[subject] = key_id
    write(ledger, events(3), live)  # its key is stored: written
    assert len(stored(ledger)) == 3

    gone = WriteKeys()
    gone.used[subject] = key_id
    gone.used["a-subject-whose-key-was-destroyed"] = "k-destroyed"
    with pytest.raises(SessionErased) as refused:
        write(ledger, events(4), gone)
    assert refused.value.subject_ids == ("a-subject-whose-key-was-destroyed",)
    assert len(stored(ledger)) == 3  # nothing more


def test_a_write_larger_than_one_statement_takes_goes_as_a_transaction(
    ledger: DeliveryLedger,
) -> None:
    probe = sqlite3.connect(":memory:")  # the same SQLite library as the recorder's
    limit = probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    probe.close()
    batch = events(limit // 4 + 1)
    write(ledger, batch)
    rows = stored(ledger)
    assert len(rows) == len(batch)
    assert rows[-1] == (batch[-1].originator_id.hex, 1, batch[-1].state)


@pytest.mark.parametrize(("backend", "most"), [("sqlite", 32), ("postgres", 64)])
def test_the_writer_cuts_groups_where_the_store_asks(store_location: str, most: int) -> None:
    """64 waited-for writes queued at once: SQLite's recorder asks for groups of 32 at most
    (its write runs beside the event loop, so two groups overlap with it); PostgreSQL's
    write takes the interpreter lock back at each round trip, and keeps one group."""
    ledger = DeliveryLedger.open(store_location)
    first_write_started, go_on = threading.Event(), threading.Event()

    def append(batch: list[object]) -> None:
        if not first_write_started.is_set():
            first_write_started.set()
            go_on.wait(10)  # meanwhile the 64 queue up behind this first group
        ledger.events.append(batch)

    writer = GroupCommitWriter(ledger, append=append)
    opener = writer.submit(writer_events(ledger, "o-first"))
    assert first_write_started.wait(10)
    queued = [writer.submit(writer_events(ledger, f"o-{n}")) for n in range(64)]
    go_on.set()
    for done in [opener, *queued]:
        assert done.exception(timeout=30) is None
    assert writer.stats.largest_group == most
    assert writer.stats.commits == 1 + 64 // most
    writer.close()
    ledger.close()
