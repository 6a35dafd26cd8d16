"""The views' pure side: events dispatched on their classes to row changes, the marker
columns written by the domain's one rule, and the SQL those changes become."""

from __future__ import annotations

import itertools
import sqlite3
import uuid
from datetime import UTC, datetime

import pytest
from recovery_support import dead_owner

from gateway_ledger.domain.delivery.marker import Marker, SendFact, marker_after
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import (
    QUARANTINED,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    QuarantineReason,
)
from gateway_ledger.infrastructure.eventstore.sql_dialect import SQLiteDialect
from gateway_ledger.infrastructure.views.writer import RowWriter
from gateway_ledger.projections.delivery.obligation_index import (
    MARKER_COLUMNS,
    IndexProjection,
    marker_change,
)
from gateway_ledger.projections.delivery.recoverable import RecoverableProjection
from gateway_ledger.projections.rows import Add, Case, Delete, Insert, Previous, Update, Upsert

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class NoSubjects:
    def subject_of(self, event: DeliveryObligation.Recorded) -> str:
        return "subject-of-" + event.obligation_id


def history() -> list[DeliveryObligation.Event]:
    """Recorded, Attempting, Failed (refused), then a claim, its delivery and a late
    success from the first owner: every event the aggregate has pending collected."""
    first, second = dead_owner(), dead_owner()
    agg = DeliveryObligation.record(
        obligation_id="o1",
        session_key="agent:main:telegram:dm:1",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="x",
        owner=first,
        now=T0,
    )
    agg.start_attempt(by=first, now=T0)
    agg.fail(by=first, now=T0, error="no", classification=ErrorClass.REJECTED)
    agg.start_attempt(by=first, now=T0)
    agg.claim(by=second, now=T0, policy=LedgerPolicy())
    agg.confirm_delivery(by=second, now=T0, fence=agg.fence)
    agg.confirm_delivery(by=first, now=T0, fence=0)  # fenced out: a late result
    return list(agg.collect_events())


def test_each_event_class_has_its_change_and_other_aggregates_events_none() -> None:
    index = IndexProjection(NoSubjects())
    recoverable = RecoverableProjection()
    events = history()
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Recorded",
        "Attempting",
        "Failed",
        "Attempting",
        "Claimed",
        "Delivered",
        "LateResultReported",
    ]
    key = events[0].originator_id.hex
    changes = [index.change(e) for e in events]
    assert type(changes[0]) is Insert and changes[0].key == key
    assert changes[0].values["subject_id"] == "subject-of-o1"
    assert all(type(c) is Update and c.key == key for c in changes[1:])
    assert changes[1].relative["send_attempts"] == Add(1)
    assert changes[4].relative["claims"] == Add(1)
    assert changes[5].values["state"] == "delivered"
    # A late success changes no state, only the marker (and the row's version).
    assert set(changes[6].values) == {*MARKER_COLUMNS, "last_transition_at", "version"}
    moved = [recoverable.change(e) for e in events]
    assert type(moved[0]) is Insert and type(moved[5]) is Delete
    assert set(moved[6].values) == {"last_transition_at", "version"}
    assert index.change(object()) is None and recoverable.change(object()) is None


def test_an_event_class_a_view_does_not_know_moves_the_version_or_takes_its_parents_change() -> (
    None
):
    class Snoozed(DeliveryObligation.Event):  # as a newer release might add
        by: object

    class Redelivered(DeliveryObligation.Delivered):
        pass

    events = history()
    base = {f: getattr(events[5], f) for f in ("originator_id", "originator_version", "timestamp")}
    snoozed = Snoozed(**base, by=None)
    redelivered = Redelivered(**base, by=events[5].by, receipt=[], fence=1)
    for projection in (IndexProjection(NoSubjects()), RecoverableProjection()):
        change = projection.change(snoozed)
        assert type(change) is Update
        assert set(change.values) == {"last_transition_at", "version"}
        assert projection.change(redelivered) == projection.change(events[5])


def test_a_row_first_seen_through_a_bad_event_is_made_from_the_placeholders() -> None:
    class Bad:
        originator_id = uuid.uuid4()
        originator_version = 3
        reason = QuarantineReason.UNDECODABLE
        obligation_id = None

    for projection in (IndexProjection(NoSubjects()), RecoverableProjection()):
        change = projection.quarantine(Bad())
        assert type(change) is Upsert and change.key == Bad.originator_id.hex
        assert change.values["state"] == QUARANTINED
        assert change.values["obligation_id"] == Bad.originator_id.hex  # named by nothing else
        assert (change.values["quarantine_reason"], change.values["version"]) == ("undecodable", 3)
        assert set(projection.placeholders) <= set(change.values)
        assert change.replace == ("state", "quarantine_reason", "quarantine_version", "version")


def table() -> tuple[sqlite3.Cursor, RowWriter]:
    db = sqlite3.connect(":memory:")
    db.row_factory = sqlite3.Row
    cursor = db.cursor()
    cursor.execute(
        "CREATE TABLE t (k TEXT PRIMARY KEY, may_have_arrived INTEGER, arrived_before INTEGER, "
        "n INTEGER, frozen TEXT)"
    )
    return cursor, RowWriter(SQLiteDialect(None), "t", "k", guard="{row}frozen IS NULL")


@pytest.mark.parametrize("recorded", [None, True, False])
@pytest.mark.parametrize("fact", list(SendFact))
def test_the_marker_columns_take_what_the_rule_says_for_every_marker_before(
    fact: SendFact, recorded: bool | None
) -> None:
    cursor, writer = table()
    change = marker_change(fact, recorded)
    befores = list(itertools.product((False, True), repeat=2))
    for i, before in enumerate(befores):
        writer.write(
            cursor, Insert(str(i), dict(zip(MARKER_COLUMNS, map(int, before), strict=True)))
        )
        writer.write(cursor, Update(str(i), dict(change.values), change.relative))
    for i, before in enumerate(befores):
        cursor.execute("SELECT * FROM t WHERE k = ?", (str(i),))
        row = cursor.fetchone()
        written = Marker(*(bool(row[c]) for c in MARKER_COLUMNS))
        assert written == marker_after(Marker(*before), fact, recorded), (before, change)


def test_the_writer_keeps_existing_rows_and_frozen_rows() -> None:
    cursor, writer = table()
    writer.write(cursor, Insert("a", {"n": 1, "may_have_arrived": 0, "arrived_before": 1}))
    writer.write(cursor, Insert("a", {"n": 9}))  # a replayed first event: kept as it was
    writer.write(cursor, Update("a", {}, {"n": Add(2), "may_have_arrived": Previous("n")}))
    case = Case(("arrived_before",), (((1,), 0), ((0,), 1)))
    writer.write(cursor, Update("a", {}, {"arrived_before": case}))
    cursor.execute("SELECT n, may_have_arrived, arrived_before FROM t")
    assert tuple(cursor.fetchone()) == (3, 1, 0)  # relative to the row before each change
    writer.write(cursor, Upsert("a", {"n": 0, "frozen": "yes"}, replace=("frozen",)))
    writer.write(cursor, Update("a", {"n": 100}))  # a frozen row takes no change
    writer.write(cursor, Delete("a"))
    writer.write(cursor, Upsert("a", {"n": 0, "frozen": "again"}, replace=("n", "frozen")))
    cursor.execute("SELECT n, frozen FROM t")
    assert tuple(cursor.fetchone()) == (3, "yes")
    writer.write(cursor, Upsert("b", {"n": 5, "frozen": "new"}, replace=("frozen",)))
    writer.write(cursor, Delete("c"))
    cursor.execute("SELECT k, n, frozen FROM t ORDER BY k")
    assert [tuple(r) for r in cursor.fetchall()] == [("a", 3, "yes"), ("b", 5, "new")]
