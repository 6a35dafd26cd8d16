"""What the CPU-per-reply work (issue 21) relies on, pinned.

- The PostgreSQL recorder's write statements are rendered once, from the library's own
  public attributes (``insert_events_statement``, ``lock_table_statements``), with the
  stored events' array sent in binary; events written so read back unchanged.
- The transcoder builds a frozen value read again only once, and never confuses values
  that compare equal across types (``1 == True``).
- The one write path's PostgreSQL write reads no notification ids back, on a connection
  of the recorder's own, and still refuses a version already taken with the library's
  ``IntegrityError``.
- The keyed names of the key ring are the HMAC-SHA256 they always were.
- The mapper remembers a bounded number of subjects, so a settled reply keeps nothing.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import SessionErased
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.eventstore.transcoder import AttrsTranscoding, OrjsonTranscoder
from gateway_ledger.infrastructure.privacy import private_mapper
from gateway_ledger.infrastructure.privacy.keyring import KeyedDigest, WriteKeys


def test_postgres_write_statements_are_rendered_once_and_events_read_back(pg_url: str) -> None:
    ledger = DeliveryLedger.open(pg_url)
    try:
        recorder = ledger.recorder
        statement = recorder.insert_events_statement
        assert all(type(part) is sql.SQL for part in statement)  # rendered once
        assert "unnest(%b::" in statement.as_string(None)  # the events' array in binary
        assert all(type(q) is sql.SQL for q in recorder.lock_table_statements)
        assert any("LOCK TABLE" in q.as_string(None) for q in recorder.lock_table_statements)
        ledger.record_obligation(
            obligation_id="cpu-1",
            session_key="agent:main:telegram:dm:1",
            platform="telegram",
            chat_id="1",
            content="bytes that must come back exactly: é \x00 ✓",
            metadata={"k": [1, 2.5, None, True]},
        )
        ledger.mark_attempting("cpu-1")
        ledger.mark_delivered("cpu-1", ["m-1"])
    finally:
        ledger.close()
    reopened = DeliveryLedger.open(pg_url)
    try:
        assert [e.type for e in reopened.history("cpu-1")] == [
            "Recorded",
            "Attempting",
            "Delivered",
        ]
        assert reopened.load("cpu-1").content == "bytes that must come back exactly: é \x00 ✓"
        assert reopened.load("cpu-1").metadata == {"k": [1, 2.5, None, True]}
    finally:
        reopened.close()


@attrs.frozen
class _Pair:
    a: object
    b: object


def test_frozen_values_are_decoded_once_and_types_are_kept_apart() -> None:
    transcoder = OrjsonTranscoder()
    transcoder.register(AttrsTranscoding(OwnerIdentity))
    transcoder.register(AttrsTranscoding(_Pair))
    owner = OwnerIdentity(host="h", boot_id="b", pid=12, start_time=34)
    data = transcoder.encode({"by": owner, "at": datetime(2026, 12, 2, tzinfo=UTC)})
    first, second = transcoder.decode(data)["by"], transcoder.decode(data)["by"]
    assert first == owner and first is second  # built (and validated) once
    one = transcoder.decode(orjson.dumps({"_type_": "_Pair", "_data_": {"a": 1, "b": 1.0}}))
    true = transcoder.decode(orjson.dumps({"_type_": "_Pair", "_data_": {"a": True, "b": 1}}))
    assert type(one.a) is int and type(one.b) is float
    assert type(true.a) is bool and type(true.b) is int
    listed = transcoder.decode(orjson.dumps({"_type_": "_Pair", "_data_": {"a": [1], "b": 2}}))
    assert listed == _Pair([1], 2)  # unhashable fields: built each time, still right


def test_a_frozen_value_holding_a_container_is_built_for_each_read() -> None:
    """A frozen value read again is the one built before, found by its data as read; one
    holding a list or a dict is built each time, so no two events share a container."""
    transcoder = OrjsonTranscoder()
    transcoder.register(AttrsTranscoding(_Pair))
    held = orjson.dumps({"_type_": "_Pair", "_data_": {"a": [1], "b": {"c": 2}}})
    first, second = transcoder.decode(held), transcoder.decode(held)
    assert first == second == _Pair([1], {"c": 2})
    assert first is not second and first.a is not second.a and first.b is not second.b
    plain = orjson.dumps({"_type_": "_Pair", "_data_": {"a": "x", "b": None}})
    assert transcoder.decode(plain) is transcoder.decode(plain) == _Pair("x", None)
    swapped = orjson.dumps({"_type_": "_Pair", "_data_": {"b": "x", "a": None}})
    assert transcoder.decode(swapped) == _Pair(None, "x")  # the same values, other fields


def test_keyed_names_are_hmac_sha256_of_the_value(tmp_path: object) -> None:
    ledger = DeliveryLedger.open(f"{tmp_path}/ledger.db")
    try:
        keyring = ledger.private_mapper.keyring
        name = keyring.keyed_name("agent:main:telegram:dm:1\0in-1")
        name_key = keyring.derived_key("gateway-ledger/subject-id/v1")
        expected = hmac.digest(name_key, b"agent:main:telegram:dm:1\0in-1", "sha256").hex()[:32]
        assert name == expected
        assert keyring.keyed_name("x") == keyring.keyed_name("x") != name
    finally:
        ledger.close()


@given(key=st.binary(max_size=200), value=st.text(max_size=300))
def test_the_keyed_digest_is_hmac_sha256(key: bytes, value: str) -> None:
    expected = hmac.new(key, value.encode("utf-8"), "sha256").hexdigest()
    assert KeyedDigest(key).hexdigest(value) == expected


def test_the_mapper_remembers_a_bounded_number_of_subjects() -> None:
    assert private_mapper.MAX_REMEMBERED_SUBJECTS <= 10_000


def test_recorded_builds_the_same_obligation_as_the_librarys_creation_event() -> None:
    """``Recorded.mutate`` skips the library's keyword filtering; what it builds must be
    what the library's own creation path builds from the same event."""
    from gateway_ledger.domain.delivery.obligation import DeliveryObligation
    from gateway_ledger.domain.values import DeliveryTarget

    owner = OwnerIdentity(host="h", boot_id="b", pid=12, start_time=34)
    built = DeliveryObligation.record(
        obligation_id="cpu-2",
        session_key="agent:main:telegram:dm:2",
        target=DeliveryTarget(platform="telegram", chat_id="2"),
        content="hello",
        owner=owner,
        now=datetime(2026, 12, 2, tzinfo=UTC),
        metadata={"a": 1},
    )
    (recorded,) = built.collect_events()
    ours = recorded.mutate(None)
    theirs = super(DeliveryObligation.Recorded, recorded).mutate(None)
    assert type(ours) is type(theirs) is DeliveryObligation
    assert vars(ours) == vars(theirs)
    assert (ours.id, ours.version, ours.created_on, ours.modified_on) == (
        theirs.id,
        theirs.version,
        theirs.created_on,
        theirs.modified_on,
    )


def test_postgres_append_reads_no_ids_back_and_refuses_a_taken_version(pg_url: str) -> None:
    """The one write path's PostgreSQL write (``notification_ids=False``): the library's
    statements without the INSERT's RETURNING, in one transaction on the recorder's own
    connection; a version already taken raises the library's ``IntegrityError`` and
    stores none of the write's events; a broken connection is replaced; a caller that
    wants the ids still gets them from the library's own write."""
    ledger = DeliveryLedger.open(pg_url)
    try:
        recorder = ledger.recorder
        assert "RETURNING" not in recorder._insert_unreturned.as_string(None)
        assert "RETURNING" in recorder.insert_events_statement.as_string(None)
        one, two = uuid.uuid4(), uuid.uuid4()
        assert (
            recorder.insert_events([StoredEvent(one, 1, "t", b"{}")], notification_ids=False)
            is None
        )
        with pytest.raises(IntegrityError):
            recorder.insert_events(
                [StoredEvent(two, 1, "t", b"{}"), StoredEvent(one, 1, "t", b"{}")],
                notification_ids=False,
            )
        assert recorder.select_events(two) == []
        ids = recorder.insert_events([StoredEvent(two, 1, "t", b"{}")])
        assert ids is not None and len(ids) == 1
        assert [e.originator_version for e in recorder.select_events(one)] == [1]
        # The server ends the write connection: the next write fails on it, drops it,
        # and is tried again (the library's retry) on a new one, where it lands.
        pid = recorder._conn.info.backend_pid
        with recorder.datastore.transaction(commit=True) as curs:
            curs.execute("SELECT pg_terminate_backend(%s)", (pid,))
        recorder.insert_events([StoredEvent(one, 2, "t", b"{}")], notification_ids=False)
        assert recorder._conn.info.backend_pid != pid
        assert [e.originator_version for e in recorder.select_events(one)] == [1, 2]
    finally:
        ledger.close()
    assert ledger.recorder._conn is None  # closed with the ledger


def _round_trips(recorder: Any, write: Callable[[], object], trace: Path) -> list[str]:
    """The statements the write connection sent to the server during ``write``, one
    entry per round trip (libpq's own trace of the protocol: a frontend ``Query``, or an
    extended-protocol statement that a ``Sync`` ends)."""
    conn = recorder._connection()
    with trace.open("w") as out:
        conn.pgconn.trace(out.fileno())
        try:
            write()
        finally:
            conn.pgconn.untrace()
    trips: list[str] = []
    for line in trace.read_text().splitlines():
        fields = line.split("\t", 4)
        if len(fields) == 5 and fields[1] == "F" and fields[3] in ("Query", "Parse"):
            trips.append(fields[4].strip())
    return trips


def test_the_usual_postgres_write_is_three_round_trips(pg_url: str, tmp_path: Path) -> None:
    """A write that carries only keys already stored (a session's later writes) sends
    ``BEGIN``, the key check, the lock statements and ``NOTIFY`` in one round trip, then
    the INSERT, then ``COMMIT`` (ADR 0066); one with a new key row goes through the
    library's hook, which stores it in the same transaction."""
    ledger = DeliveryLedger.open(pg_url)
    try:
        recorder = ledger.recorder

        def record(oid: str, key: str) -> None:
            ledger.record_obligation(
                obligation_id=oid, session_key=key, platform="telegram", chat_id="7", content=oid
            )

        first = _round_trips(
            recorder, lambda: record("rt-1", "agent:main:telegram:dm:7"), tmp_path / "1"
        )
        later = _round_trips(
            recorder, lambda: record("rt-2", "agent:main:telegram:dm:7"), tmp_path / "2"
        )
        assert len(later) == 3, later
        opening, insert, commit = later
        assert opening.startswith('"BEGIN;') and "FOR KEY SHARE" in opening
        assert "LOCK TABLE" in opening and "NOTIFY" in opening
        assert "INSERT" in insert and commit == '"COMMIT"'
        assert len(first) > 3 and any("ON CONFLICT DO NOTHING" in trip for trip in first)
        assert ledger.get("rt-1").content == "rt-1" and ledger.get("rt-2").content == "rt-2"
    finally:
        ledger.close()


def test_the_usual_postgres_write_refuses_keys_no_longer_stored_and_stores_nothing(
    pg_url: str,
) -> None:
    """The key check that travels with ``BEGIN`` (ADR 0066) names its subjects in a
    literal: a hex subject id as it is, any other quoted by psycopg. Either way a key
    that is not stored (destroyed meanwhile) refuses the write, names the subject, and
    rolls back everything, on a connection that then writes again."""
    ledger = DeliveryLedger.open(pg_url)
    try:
        ledger.record_obligation(  # a sealed write: the key table exists from here
            obligation_id="k-1", session_key="agent:main:telegram:dm:8", platform="telegram",
            chat_id="8", content="hi",
        )  # fmt: skip
        recorder = ledger.recorder
        event = StoredEvent(uuid.uuid4(), 1, "t", b"{}")
        for subject in ("0123abcd" * 4, "a'b,\"c\\{d}"):
            keys = WriteKeys()
            keys.used[subject] = "k-gone"
            with pytest.raises(SessionErased) as refused:
                recorder.insert_events([event], keys=keys, notification_ids=False)
            assert refused.value.subject_ids == (subject,)
            assert recorder.select_events(event.originator_id) == []
        recorder.insert_events([event], notification_ids=False)
        assert [e.originator_version for e in recorder.select_events(event.originator_id)] == [1]
    finally:
        ledger.close()
