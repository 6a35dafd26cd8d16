"""A new subject's data key is stored in the same transaction as its first sealed events.

By the recorder every write goes through (the application's event store hands it the
write's keys explicitly), on SQLite and on PostgreSQL, whether the write comes from the
group-commit writer or from the synchronous API.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.privacy.key_table import KEYS_TABLE, is_tombstone

KEY = "agent:main:telegram:dm:4242"


def obligation(ledger: DeliveryLedger, oid: str, key: str = KEY) -> Any:
    return ledger.new_obligation(
        obligation_id=oid, session_key=key, platform="telegram", chat_id="4242", content="hi"
    )


def key_rows(db: Path) -> list[tuple[str, str]]:
    reader = DeliveryLedger.open(db)
    table = reader.private_mapper.keyring.table
    rows = [(subject, key_id) for key_id, subject, _ in table.rows()]
    reader.close()
    return rows


def sealed_key_id(ledger: DeliveryLedger, oid: str) -> str:
    (first,) = ledger.recorder.select_events(ledger.aggregate_id(oid), lte=1)
    return str(orjson.loads(first.state)["_sealed_"]["k"])


def record(ledger: DeliveryLedger, oid: str, content: str = "hi", key: str = KEY) -> None:
    ledger.record_obligation(
        obligation_id=oid, session_key=key, platform="telegram", chat_id="4242",
        content=content,
    )  # fmt: skip


def racing(mapped: Callable[[Any], Any], race: Callable[[], None]) -> tuple[Any, list[Any]]:
    """A mapper that lets another writer store the subject's key after its first event
    (our new key then exists in memory only), and the events it was asked to map."""
    calls: list[Any] = []

    def map_then_race(event: Any, *keys: Any) -> Any:
        calls.append(event)
        stored = mapped(event, *keys)
        if len(calls) == 1:
            race()
        return stored

    return map_then_race, calls


def test_the_first_events_of_a_subject_carry_its_key_row_in_their_commit(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = DeliveryLedger.open(db)
    keyring = ledger.private_mapper.keyring
    keyring.table.close()  # it reopens to look the subject up, and must write nothing
    writer = GroupCommitWriter(ledger)
    writer.submit(obligation(ledger, "o-1").collect_events()).result(timeout=10)
    writer.submit(obligation(ledger, "o-2").collect_events()).result(timeout=10)
    writer.close()
    assert writer.stats.commits == 2  # no extra write for the key
    private = keyring.table._conn  # type: ignore[attr-defined]
    assert private is not None and private.total_changes == 0
    ((subject, key_id),) = key_rows(db)
    assert subject == keyring.subject_id(KEY)
    assert sealed_key_id(ledger, "o-1") == sealed_key_id(ledger, "o-2") == key_id
    fresh = DeliveryLedger.open(db)  # no cached key: it opens from the stored row
    assert [e.fields["content"] for e in fresh.history("o-1")][:1] == ["hi"]


@pytest.mark.parametrize("path", ["group-commit writer", "synchronous API"])
def test_a_key_another_writer_stored_meanwhile_wins_and_the_events_are_sealed_again(
    tmp_path: Path, path: str
) -> None:
    db = tmp_path / "ledger.db"
    ours = DeliveryLedger.open(db)
    theirs = DeliveryLedger.open(db)

    def race() -> None:
        record(theirs, "o-theirs", content="theirs")

    ours.mapper.to_stored_event, calls = racing(ours.mapper.to_stored_event, race)  # type: ignore[method-assign]
    if path == "group-commit writer":
        writer = GroupCommitWriter(ours)
        writer.submit(obligation(ours, "o-ours").collect_events()).result(timeout=10)
        writer.close()
    else:
        record(ours, "o-ours")
    assert len(calls) == 2  # rolled back once, sealed again
    ((_, key_id),) = key_rows(db)  # one key for the subject: theirs
    assert sealed_key_id(ours, "o-ours") == sealed_key_id(theirs, "o-theirs") == key_id
    reader = DeliveryLedger.open(db)
    assert reader.history("o-ours")[0].fields["content"] == "hi"
    assert reader.history("o-theirs")[0].fields["content"] == "theirs"


def test_a_group_that_fails_forgets_its_new_keys_and_the_retry_stores_one(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = DeliveryLedger.open(db)
    ledger.save(obligation(ledger, "o-dup", key="agent:main:telegram:dm:old"))
    writer = GroupCommitWriter(ledger)
    new_subjects = [f"agent:main:telegram:dm:new-{i}" for i in range(3)]
    with writer._cond:  # one group: three new subjects and a clash
        futures = [
            writer.submit(obligation(ledger, f"o-{i}", key=k).collect_events())
            for i, k in enumerate(new_subjects)
        ]
        clash = obligation(ledger, "o-dup", key="agent:main:telegram:dm:old")
        futures.append(writer.submit(clash.collect_events()))
    assert [f.exception(timeout=10) is None for f in futures[:3]] == [True] * 3
    assert isinstance(futures[3].exception(timeout=10), ConcurrentUpdate)
    writer.close()
    rows = key_rows(db)
    keyring = ledger.private_mapper.keyring
    assert sorted(s for s, _ in rows) == sorted(
        keyring.subject_id(k) for k in [*new_subjects, "agent:main:telegram:dm:old"]
    )
    by_subject = dict(rows)
    for i, k in enumerate(new_subjects):
        # Sealed with the key that was stored, not with the failed group's forgotten one.
        assert sealed_key_id(ledger, f"o-{i}") == by_subject[keyring.subject_id(k)]
    reader = DeliveryLedger.open(db)
    assert all(reader.history(f"o-{i}")[0].fields["content"] == "hi" for i in range(3))
    with reader.recorder.datastore.transaction(commit=False) as c:
        c.execute(f"SELECT count(*) FROM {KEYS_TABLE}")
        assert c.fetchone()[0] == 4


# -- the synchronous API on SQLite: KeyedSQLiteApplicationRecorder -------------------------


def test_the_synchronous_api_writes_a_new_key_in_the_events_transaction(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = DeliveryLedger.open(db)
    keyring = ledger.private_mapper.keyring
    keyring.table.close()  # it reopens to look the subject up, and must write nothing
    record(ledger, "o-1")
    ledger.mark_attempting("o-1")
    ledger.mark_delivered("o-1", ["m-1"])
    private = keyring.table._conn  # type: ignore[attr-defined]
    assert private is not None and private.total_changes == 0
    ((subject, key_id),) = key_rows(db)
    assert subject == keyring.subject_id(KEY) and sealed_key_id(ledger, "o-1") == key_id
    fresh = DeliveryLedger.open(db)
    assert fresh.get("o-1").state == "delivered"
    assert fresh.history("o-1")[0].fields["content"] == "hi"


# -- PostgreSQL: KeyedPostgresApplicationRecorder (ADR 0023) ---------------------------------


def test_on_postgresql_a_new_key_is_committed_by_its_events_own_transaction(pg_url: str) -> None:
    """The same transaction id (``xmin``) wrote the key row and the first sealed event."""
    ledger = DeliveryLedger.open(pg_url)
    record(ledger, "o-1")
    ledger.mark_attempting("o-1")
    keyring = ledger.private_mapper.keyring
    subject = keyring.subject_id(KEY)
    schema = ledger.recorder.datastore.schema
    with ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute(
            f'SELECT xmin::text AS x FROM "{schema}".{KEYS_TABLE} WHERE subject_id = %s',
            (subject,),
        )
        key_tx = [row["x"] for row in c.fetchall()]
        c.execute(
            f'SELECT xmin::text AS x FROM "{schema}".{ledger.recorder.events_table_name} '
            "WHERE originator_id = %s AND originator_version = 1",
            (ledger.aggregate_id("o-1"),),
        )
        event_tx = [row["x"] for row in c.fetchall()]
    assert key_tx == event_tx and len(key_tx) == 1
    assert DeliveryLedger.open(pg_url).history("o-1")[0].fields["content"] == "hi"
    ledger.close()


def test_on_postgresql_a_key_another_writer_stored_meanwhile_wins(pg_url: str) -> None:
    ours = DeliveryLedger.open(pg_url)
    theirs = DeliveryLedger.open(pg_url)

    def race() -> None:
        record(theirs, "o-theirs", content="theirs")

    ours.mapper.to_stored_event, calls = racing(ours.mapper.to_stored_event, race)  # type: ignore[method-assign]
    record(ours, "o-ours")
    assert len(calls) == 2  # rolled back once, sealed again with their key
    keyring = ours.private_mapper.keyring
    rows = [(s, k) for k, s, _ in keyring.table.rows() if s == keyring.subject_id(KEY)]
    assert len(rows) == 1
    assert sealed_key_id(ours, "o-ours") == sealed_key_id(theirs, "o-theirs") == rows[0][1]
    reader = DeliveryLedger.open(pg_url)
    assert reader.history("o-ours")[0].fields["content"] == "hi"
    assert reader.history("o-theirs")[0].fields["content"] == "theirs"
    for opened in (ours, theirs, reader):
        opened.close()


def test_a_key_stored_outside_a_write_follows_the_same_rows_rule(store_location: str) -> None:
    """``KeyTable.insert`` (for a mapping outside any write) fills an empty row or
    replaces the tombstone it names, and nothing else, on both stores (ADR 0071)."""
    ledger = DeliveryLedger.open(store_location)
    table = ledger.private_mapper.keyring.table
    subject = ledger.private_mapper.keyring.subject_id(KEY)
    assert table.insert((subject, "k-1", b"w1", "t1"))
    assert not table.insert((subject, "k-2", b"w2", "t2"))  # the subject has a key
    assert table.destroy(subject) == ["k-1"]
    found = table.find(subject)
    assert found is not None and is_tombstone(found[0])
    assert not table.insert((subject, "k-3", b"w3", "t3"))  # an empty row is not there
    assert not table.insert((subject, "k-3", b"w3", "t3"), replaces="erased-another")
    assert table.insert((subject, "k-3", b"w3", "t3"), replaces=found[0])
    assert table.find(subject) == ("k-3", b"w3", "t3")
    ledger.close()
