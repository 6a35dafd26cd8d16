"""A batch's changes folded in memory give exactly what the statements give, or are not
folded (``infrastructure/views/fold.py``), on both stores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recovery_support import dead_owner

from gateway_ledger.application.delivery.dead_letters import retry_dead_letter
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.sql_dialect import SqlDialect, dialect_for
from gateway_ledger.infrastructure.views.delivery import STILL_READ
from gateway_ledger.infrastructure.views.fold import FoldFailed, RowFold, declared_defaults
from gateway_ledger.infrastructure.views.sql_view import catch_up_views
from gateway_ledger.infrastructure.views.writer import RowWriter
from gateway_ledger.projections.delivery.obligation_view import still_read
from gateway_ledger.projections.rows import (
    Add,
    Case,
    Delete,
    Insert,
    Previous,
    RowChange,
    Update,
    Upsert,
)

COLUMNS = (
    "k TEXT PRIMARY KEY, a BIGINT, b INTEGER, n INTEGER NOT NULL DEFAULT 0, s TEXT, "
    "quarantine_reason TEXT"
)
KEYS = ("k0", "k1", "k2", "k3")
REASONS = st.sampled_from([None, "unreadable", "undecodable"])


def takes_changes(read: Any) -> bool:
    return still_read(read("quarantine_reason"))


@pytest.fixture
def store(store_location: str) -> Iterator[tuple[SqlDialect, DeliveryLedger]]:
    ledger = DeliveryLedger.open(store_location)
    dialect = dialect_for(ledger.recorder)
    with dialect.write_transaction() as c:
        for name in ("fold_by_statement", "fold_in_memory"):
            c.execute(f"CREATE TABLE IF NOT EXISTS {dialect.table(name)} ({COLUMNS})")
    try:
        yield dialect, ledger
    finally:
        ledger.close()


def rows(dialect: SqlDialect, name: str) -> list[dict[str, Any]]:
    with dialect.read_cursor() as c:
        c.execute(f"SELECT k, a, b, n, s, quarantine_reason FROM {dialect.table(name)} ORDER BY k")
        return [dict(row) for row in c.fetchall()]


def record(ledger: DeliveryLedger, oid: str, platform: str = "telegram", *, chat: int) -> None:
    """One reply to chat ``chat`` of ``platform``, recorded."""
    ledger.record_obligation(
        obligation_id=oid,
        session_key=f"agent:main:{platform}:dm:{chat}",
        platform=platform,
        chat_id=str(chat),
        content=f"reply {oid}",
    )


def attempting(
    ledger: DeliveryLedger, prefix: str, count: int, platform: str, *, chats: int
) -> Iterator[tuple[int, str]]:
    """``count`` replies over ``chats`` chats, each recorded and its send started; yields
    each one's number and id, for the test to carry its history on."""
    for n in range(count):
        oid = f"{prefix}-{n}"
        record(ledger, oid, platform, chat=n % chats)
        ledger.mark_attempting(oid)
        yield n, oid


small = st.integers(min_value=-3, max_value=3)
bit = st.sampled_from([0, 1, None])
text = st.sampled_from(["x", "y", ""])


@st.composite
def full_values(draw: Any) -> dict[str, Any]:
    return {
        "a": draw(st.one_of(st.none(), small)),
        "b": draw(bit),
        "n": draw(small),
        "s": draw(st.one_of(st.none(), text)),
        "quarantine_reason": draw(REASONS),
    }


@st.composite
def some_values(draw: Any, names: tuple[str, ...]) -> dict[str, Any]:
    values = draw(full_values())
    chosen = draw(st.lists(st.sampled_from(names), unique=True))
    return {name: values[name] for name in chosen}


CASES = [
    Case(("b",), (((0,), 5), ((1,), 7))),
    Case(("a", "b"), (((0, 0), 1), ((1, 1), 0), ((2, 0), 3))),
]


@st.composite
def changes(draw: Any) -> RowChange:
    key = draw(st.sampled_from(KEYS))
    kind = draw(st.sampled_from(["insert", "insert-some", "update", "delete", "upsert"]))
    if kind == "insert":
        return Insert(key, draw(full_values()))
    if kind == "insert-some":  # columns left out take their defaults
        return Insert(key, draw(some_values(("a", "b", "s", "quarantine_reason"))))
    if kind == "delete":
        return Delete(key)
    if kind == "upsert":
        values = draw(full_values())
        replace = draw(st.lists(st.sampled_from(sorted(values)), unique=True, min_size=1))
        return Upsert(key, values, replace=tuple(replace))
    relative: dict[str, Any] = {}
    if draw(st.booleans()):
        relative["n"] = Add(draw(st.integers(min_value=1, max_value=3)))
    if draw(st.booleans()):
        relative["b"] = Previous("a")
    if draw(st.booleans()):
        relative["a"] = draw(st.sampled_from(CASES))
    settable = tuple(c for c in ("a", "s", "quarantine_reason") if c not in relative)
    return Update(key, draw(some_values(settable)), relative)


def table_holding(dialect: SqlDialect, name: str, before: dict[str, dict[str, Any]]) -> RowWriter:
    """A writer of table ``name``, which holds exactly the rows ``before``."""
    writer = RowWriter(dialect, name, "k", guard=STILL_READ)
    with dialect.write_transaction() as c:
        c.execute(f"DELETE FROM {dialect.table(name)}")
        for key, values in before.items():
            writer.write(c, Insert(key, values))
    return writer


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    before=st.dictionaries(st.sampled_from(KEYS), full_values(), max_size=3),
    batch=st.lists(changes(), max_size=14),
)
def test_a_folded_batch_leaves_the_rows_its_statements_leave(
    store: tuple[SqlDialect, DeliveryLedger],
    before: dict[str, dict[str, Any]],
    batch: list[RowChange],
) -> None:
    dialect, _ = store
    defaults = declared_defaults(COLUMNS)
    assert defaults == {"n": 0}
    folded = 0
    for name, fold in (("fold_by_statement", False), ("fold_in_memory", True)):
        writer = table_holding(dialect, name, before)
        with dialect.write_transaction() as c:
            sink: RowWriter | RowFold = writer
            if fold:
                sink = RowFold(writer, takes_changes, defaults)
                sink.begin(c, {change.key for change in batch})
            for change in batch:
                sink.write(c, change)
            sink.finish(c)
            if isinstance(sink, RowFold):
                folded = sink.folded
    assert rows(dialect, "fold_in_memory") == rows(dialect, "fold_by_statement")
    if batch and not before:
        assert folded > 0  # nothing existed: the first change at least was folded


class CountingCursor:
    """A cursor that counts the statements it is given (``executemany`` once)."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.statements: list[str] = []

    def execute(self, sql: Any, params: Any = ()) -> Any:
        self.statements.append("execute")
        return self.cursor.execute(sql, params)

    def executemany(self, sql: Any, params: Any) -> Any:
        self.statements.append(f"executemany x{len(params)}")
        return self.cursor.executemany(sql, params)

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> Any:
        return self.cursor.fetchall()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_run_of_one_statement_on_stored_rows_is_sent_once_and_leaves_the_same_rows(
    store: tuple[SqlDialect, DeliveryLedger],
) -> None:
    """A sweep's claims: the same update of many rows the store has (a relative value
    among it, one row twice, in order) goes as one statement's rows, then a change of
    another shape after it; the rows are those the statements leave one by one."""
    dialect, _ = store
    before = {
        f"r{i}": {"a": i, "b": 0, "n": 0, "s": "x", "quarantine_reason": None} for i in range(6)
    }
    run = [Update(key, {"s": "claimed"}, {"n": Add(1)}) for key in before]
    batch: list[RowChange] = [*run, Update("r0", {"s": "again"}, {"n": Add(1)}), Delete("r5")]
    sent: list[str] = []
    for name, fold in (("fold_by_statement", False), ("fold_in_memory", True)):
        writer = table_holding(dialect, name, before)
        with dialect.write_transaction() as c:
            if fold:
                counting = CountingCursor(c)
                sink = RowFold(writer, takes_changes, declared_defaults(COLUMNS))
                sink.begin(counting, set())  # a batch that begins no aggregate
                for change in batch:
                    sink.write(counting, change)
                sink.finish(counting)
                sent = counting.statements
            else:
                for change in batch:
                    writer.write(c, change)
    assert sent == ["executemany x7", "execute"]
    assert rows(dialect, "fold_in_memory") == rows(dialect, "fold_by_statement")
    assert [r["n"] for r in rows(dialect, "fold_in_memory")] == [2, 1, 1, 1, 1]


def test_a_refused_folded_write_is_redone_unfolded_and_blames_its_event(tmp_path: Any) -> None:
    """The store refuses a row only as several events leave it (a CHECK here): the folded
    batch fails as a whole, is applied again one statement per change, and the one event
    whose statement is refused quarantines its obligation, nothing else. (SQLite: on
    PostgreSQL a value is refused as it is adapted, before a statement is sent, which the
    fold cannot meet: its rows hold only values each event's statement would send.)"""
    ledger = DeliveryLedger.open(tmp_path / "ledger.db")
    try:
        dialect = dialect_for(ledger.recorder)
        index = ledger.obligation_index
        checked = "send_attempts INTEGER NOT NULL CHECK (send_attempts < 2)"
        columns = index.columns.replace("send_attempts INTEGER NOT NULL", checked)
        with dialect.write_transaction() as c:  # made before the view makes it
            c.execute(f"CREATE TABLE {index.table} ({columns})")
        for n, oid in attempting(ledger, "fold", 3, "telegram", chats=3):
            if n == 1:  # a second send: the index may not hold two (its CHECK)
                ledger.mark_failed(oid, "timeout", classification="ambiguous")
                ledger.mark_attempting(oid)
            ledger.mark_delivered(oid, receipt=[str(n)])
        assert index.catch_up() == 11
        got = {row["obligation_id"]: row for row in index.rows().values()}
        assert got["fold-0"]["state"] == got["fold-2"]["state"] == "delivered"
        assert got["fold-0"]["quarantine_reason"] is None
        assert got["fold-1"]["state"] == "quarantined"
        assert got["fold-1"]["quarantine_version"] == 4  # the second Attempting
    finally:
        ledger.close()


def test_a_fold_that_cannot_read_the_rows_fails_as_a_whole(tmp_path: Any) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db")
    try:
        dialect = dialect_for(ledger.recorder)
        writer = RowWriter(dialect, "no_such_table", "k")
        with pytest.raises(FoldFailed), dialect.write_transaction() as c:
            RowFold(writer, takes_changes, {}).begin(c, {"k0"})
    finally:
        ledger.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_both_views_folded_equal_both_views_by_statement(store_location: str) -> None:
    """Real histories: delivered at once, failed and retried, abandoned, left pending
    and then claimed by a sweep (half of those delivered); views caught up folded, in
    batches of several sizes, equal a replay one statement per change."""
    ledger = DeliveryLedger.open(store_location, owner=dead_owner())
    try:
        for n in range(40):
            oid = f"h-{n}"
            record(ledger, oid, "telegram", chat=n % 7)
            if n % 5 == 4:
                continue  # left pending, for the sweep
            ledger.mark_attempting(oid)
            if n % 3 == 0:
                ledger.mark_failed(oid, "timeout", classification="ambiguous")
                if n % 2 == 0:
                    ledger.mark_attempting(oid)
                    ledger.mark_delivered(oid, receipt=["r"])
            elif n % 3 == 1:
                ledger.mark_delivered(oid, receipt=["r"])
            else:
                ledger.abandon(oid, reason="operator", detail="stuck in a test")
        sweeper = DeliveryLedger.open(store_location)  # the first owner is not alive
        try:
            claimed = sweeper.sweep_recoverable()
            assert claimed
            for item in claimed[::2]:
                sweeper.mark_delivered(item["obligation_id"], receipt=["again"])
        finally:
            sweeper.close()
        views_folded_equal_views_by_statement(ledger, (1, 7, 500))
    finally:
        ledger.close()


def views_folded_equal_views_by_statement(
    ledger: DeliveryLedger, batch_sizes: tuple[int, ...]
) -> list[int]:
    """Each view caught up from nothing, folded, in batches of each size, equals the same
    view caught up one statement per change, and the view itself equals a rebuild.
    Returns how many rows each compared pair held."""
    counts = []
    for view in (ledger.recoverable, ledger.obligation_index):
        for batch_size in batch_sizes:
            shadow, reference = (
                view.renamed(f"f_{batch_size}_a"),
                view.renamed(f"f_{batch_size}_b"),
            )
            reference.runner.folds = False
            try:
                shadow.runner.catch_up(batch_size=batch_size)
                reference.runner.catch_up(batch_size=batch_size)
                assert shadow.rows() == reference.rows()
                assert shadow.rows()  # something to compare
                counts.append(len(shadow.rows()))
            finally:
                shadow.drop()
                reference.drop()
        assert view.rebuild_and_verify().equal
    return counts


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_rows_brought_back_in_a_later_batch_equal_rows_by_statement(store_location: str) -> None:
    """A batch asks the store only about the aggregates it begins (ADR 0081): a row made
    by a later event (a dead letter retried, a failure after acceptance), in a batch that
    does not begin its aggregate, goes to the store by statement, and the views equal a
    replay one statement per change."""
    ledger = DeliveryLedger.open(store_location)
    try:
        ids = []
        for n, oid in attempting(ledger, "b", 12, "telegram", chats=3):
            ids.append(oid)
            if n % 2:
                ledger.abandon(oid, reason="operator", detail="stuck in a test")
            else:
                ledger.mark_delivered(oid, receipt=["r"])
        for n, oid in enumerate(ids):
            if n % 2:
                retry_dead_letter(ledger, oid, "ops")
            else:
                ledger.report_status(oid, "failed_after_acceptance")
            if n % 3 == 0:
                ledger.mark_attempting(oid)
        counts = views_folded_equal_views_by_statement(ledger, (1, 5, 500))
        assert counts == [12] * 6  # every one is owed again, in both views
    finally:
        ledger.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_views_caught_up_together_equal_views_caught_up_alone(store_location: str) -> None:
    """One read and decode of each batch for both views, from different positions (one
    view ahead of the other), applies to each exactly what it alone would."""
    ledger = DeliveryLedger.open(store_location)
    try:
        for n, oid in attempting(ledger, "t", 30, "slack", chats=4):
            if n % 2:
                ledger.mark_delivered(oid, receipt=["r"])
            if n == 12:  # the index goes ahead of the recoverable view
                ledger.obligation_index.catch_up()
        views = [ledger.recoverable, ledger.obligation_index]
        alone = [view.renamed(view.name + "_alone") for view in views]
        try:
            for view in alone:
                view.catch_up(batch_size=7)
            assert ledger.recoverable.position() < ledger.obligation_index.position()
            applied = catch_up_views(views, batch_size=7)
            assert applied[0] > applied[1] > 0
            for view, reference in zip(views, alone, strict=True):
                assert view.position() == reference.position()
                assert view.rows() == reference.rows()
        finally:
            for view in alone:
                view.drop()
    finally:
        ledger.close()
