"""The RecoverableObligations view: an index that a rebuild from events reproduces exactly."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from recovery_support import dead_owner, record_orphans, truth_snapshot, view_snapshot

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
)

OWNERS = [dead_owner() for _ in range(3)]
POLICY = LedgerPolicy()
T0 = datetime(2026, 1, 1, tzinfo=UTC)

index = st.integers(0, 2)
step = st.one_of(
    st.tuples(st.just("record"), index, st.integers(0, 2)),
    st.tuples(st.just("attempt"), index),
    st.tuples(st.just("record"), index, st.integers(0, 2)),
    st.tuples(st.just("attempt"), index),
    st.tuples(st.just("deliver"), index),
    st.tuples(st.just("fail"), index, st.sampled_from(list(ErrorClass))),
    st.tuples(st.just("claim"), index, st.integers(0, 2)),
    st.tuples(st.just("abandon"), index),
    # As a sweep stores them: the view follows the write from memory where it can.
    st.tuples(st.just("claim_followed"), index, st.integers(0, 2)),
    st.tuples(st.just("abandon_followed"), index),
    st.tuples(st.just("catch_up"), st.integers(1, 7)),
    st.tuples(st.just("reconcile"), index, st.sampled_from(["arrived", "not_arrived", "unknown"])),
    st.tuples(st.just("status"), index, st.sampled_from(["read", "failed_after_acceptance"])),
)


def run_step(
    ledger: DeliveryLedger, ids: list[str], action: tuple[Any, ...], now: datetime
) -> None:
    kind = action[0]
    if kind == "catch_up":
        ledger.recoverable.catch_up(batch_size=action[1], max_batches=1)
        return
    oid = ids[action[1]]
    if kind == "record":
        if not ledger.exists(oid):
            ledger.save(
                DeliveryObligation.record(
                    obligation_id=oid,
                    session_key="agent:main:telegram:dm:1",
                    target=DeliveryTarget(platform=f"p{action[2]}", chat_id="1"),
                    content="x",
                    owner=OWNERS[action[2]],
                    now=now,
                )
            )
        return
    if not ledger.exists(oid):
        return
    agg = ledger.load(oid)
    try:
        if kind == "attempt":
            agg.start_attempt(by=agg.owner, now=now)
        elif kind == "deliver":
            agg.confirm_delivery(by=agg.owner, now=now, receipt=["r"])
        elif kind == "fail":
            agg.fail(by=agg.owner, now=now, error="e", classification=action[2])
        elif kind in ("claim", "claim_followed"):
            agg.claim(by=OWNERS[action[2]], now=now, policy=POLICY)
        elif kind in ("abandon", "abandon_followed"):
            agg.abandon(reason=AbandonReason.OPERATOR, now=now, detail="stop")
        elif kind == "reconcile":  # ADR 0050: the platform's answer before a re-send
            ids = ["r"] if action[2] == "arrived" else []
            agg.reconcile(by=agg.owner, now=now, outcome=action[2], message_ids=ids)
        elif kind == "status":  # a failure after acceptance reopens it: back in the view
            agg.report_status(status=action[2], at=now, now=now, message_id="r")
    except IllegalTransition:
        return
    if kind.endswith("_followed"):
        ledger.recoverable.follow(ledger.store_changes([agg]))
    else:
        ledger.save(agg)


def test_rebuild_equals_the_incrementally_maintained_view(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    every_id: list[str] = []

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        steps=st.lists(step, min_size=5, max_size=40),
        final_batch=st.integers(1, 50),
        rebuild_batch=st.integers(1, 50),
    )
    def prop(steps: list[tuple[Any, ...]], final_batch: int, rebuild_batch: int) -> None:
        # Every example adds its own obligations to the same store: the property holds
        # over the whole accumulated history, not just this example's.
        prefix = uuid.uuid4().hex[:8]
        ids = [f"{prefix}-{i}" for i in range(3)]
        every_id.extend(ids)
        for n, action in enumerate(steps):
            run_step(ledger, ids, action, T0 + timedelta(seconds=n))
        ledger.recoverable.catch_up(batch_size=final_batch)
        incremental = view_snapshot(ledger)

        # The view holds exactly the unresolved obligations, as the aggregates say.
        existing = [oid for oid in every_id if ledger.exists(oid)]
        truth = truth_snapshot(ledger, existing)
        assert {row[0]: (row[2], row[4], row[5], row[8]) for row in incremental} == truth

        ledger.recoverable.rebuild(batch_size=rebuild_batch)
        assert view_snapshot(ledger) == incremental

    prop()


def test_catch_up_is_idempotent_and_tracks_its_own_position(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=dead_owner())
    for i in range(3):
        ledger.record_obligation(
            obligation_id=f"o{i}", session_key="k", platform="telegram", chat_id="1", content="x"
        )
    view = ledger.recoverable
    assert view.position() == 0
    assert view.catch_up(batch_size=2, max_batches=1) == 2
    assert view.count() == 2
    assert view.catch_up() == 1
    assert view.catch_up() == 0
    assert view.position() == ledger.recorder.max_notification_id()
    assert view.runner.lag() == 0
    # A second, independent runner over the same tables sees the same position.
    other = DeliveryLedger.open(store_location)
    assert other.recoverable.catch_up() == 0
    assert [e.obligation_id for e in other.recoverable.entries()] == ["o0", "o1", "o2"]


def test_the_views_are_caught_up_without_opening_a_single_data_key(
    store_location: str, monkeypatch: Any
) -> None:
    """The recoverable view and the operators' index read no personal field: their events
    are decoded sealed, so no data key is read and no reply text is held. History still
    opens them."""
    writer = DeliveryLedger.open(store_location, owner=dead_owner())
    for i in range(3):
        writer.record_obligation(
            obligation_id=f"o{i}", session_key=f"agent:main:telegram:dm:{i}",
            platform="telegram", chat_id=str(i), content=f"secret {i}",
        )  # fmt: skip
    writer.mark_attempting("o1")
    reader = DeliveryLedger.open(store_location)
    opened: list[str] = []
    keyring = reader.mapper.keyring
    real_opening_key = keyring.opening_key

    def opening_key(subject_id: str, key_id: str) -> Any:
        opened.append(subject_id)
        return real_opening_key(subject_id, key_id)

    monkeypatch.setattr(keyring, "opening_key", opening_key)
    monkeypatch.setattr(keyring, "prefetch_opening", lambda pairs: opened.extend(pairs))
    assert reader.recoverable.catch_up() == 4
    entries = {e.obligation_id: e.state for e in reader.recoverable.entries()}
    assert entries == {"o0": "pending", "o1": "attempting", "o2": "pending"}
    # The operators' index too: it names each session by the envelope's keyed subject id.
    index = reader.obligation_index
    assert index.catch_up() == 4
    subjects = {row["obligation_id"]: row["subject_id"] for row in index.select()}
    assert subjects == {
        f"o{i}": keyring.subject_id(f"agent:main:telegram:dm:{i}") for i in range(3)
    }
    assert opened == []
    assert reader.history("o0")[0].fields["content"] == "secret 0"  # outside: opened
    assert opened
    reader.close()
    writer.close()


late = st.tuples(st.just("late"), index, st.sampled_from(list(ErrorClass)), st.booleans())


def report_late(
    ledger: DeliveryLedger, ids: list[str], action: tuple[Any, ...], now: datetime
) -> None:
    """A fenced-out owner reports its own send: delivered, or failed as ``action[2]``."""
    oid = ids[action[1]]
    if not ledger.exists(oid):
        return
    agg = ledger.load(oid)
    if agg.fence == 0:
        return  # nobody was fenced out yet
    stale = next(o for o in OWNERS if o != agg.owner)
    if action[3]:
        agg.confirm_delivery(by=stale, now=now, receipt=["late"], fence=agg.fence - 1)
    else:
        agg.fail(by=stale, now=now, error="late", classification=action[2], fence=agg.fence - 1)
    ledger.save(agg)


def test_the_index_holds_the_aggregates_marker_and_rebuilds_to_the_same(
    store_location: str,
) -> None:
    """The index's marker columns are the aggregate's marker after any history (late
    results included), and a rebuild of the index reproduces every row."""
    ledger = DeliveryLedger.open(store_location)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(steps=st.lists(st.one_of(step, late), min_size=5, max_size=40))
    @example(  # a claim before any send, then the first owner's late success: it arrived
        steps=[("record", 0, 0), ("claim", 0, 1), ("late", 0, ErrorClass.AMBIGUOUS, True)]
    )
    def prop(steps: list[tuple[Any, ...]]) -> None:
        prefix = uuid.uuid4().hex[:8]
        ids = [f"{prefix}-{i}" for i in range(3)]
        for n, action in enumerate(steps):
            now = T0 + timedelta(seconds=n)
            if action[0] == "late":
                report_late(ledger, ids, action, now)
            elif action[0] != "catch_up":
                run_step(ledger, ids, action, now)
            else:
                ledger.obligation_index.catch_up(batch_size=action[1], max_batches=1)
        index = ledger.obligation_index
        index.catch_up()
        rows = {row["obligation_id"]: dict(row) for row in index.select()}
        for oid in ids:
            if ledger.exists(oid):
                agg = ledger.load(oid)
                marker = (bool(rows[oid]["may_have_arrived"]), bool(rows[oid]["arrived_before"]))
                assert marker == (agg.may_have_arrived, agg.arrived_before_this_send), oid
        index.rebuild()
        assert {row["obligation_id"]: dict(row) for row in index.select()} == rows

    prop()


def test_the_view_follows_its_own_write_from_memory_only_right_after_its_position(
    store_location: str,
) -> None:
    """A sweep's claims reach the view without being read back and decoded, when nothing
    came between the view's position and them and they keep nothing sealed; otherwise
    the view is caught up from the log. Either way it holds what a rebuild gives."""
    dead = DeliveryLedger.open(store_location, owner=dead_owner())
    for i in range(4):
        dead.record_obligation(
            obligation_id=f"o{i}", session_key="k", platform="telegram", chat_id="1", content="x"
        )
    sweeper = DeliveryLedger.open(store_location)
    view = sweeper.recoverable
    view.catch_up()
    now = T0 + timedelta(days=1)
    claimed = [sweeper.load(f"o{i}") for i in range(2)]
    for obligation in claimed:
        obligation.claim(by=sweeper.owner, now=now, policy=POLICY)
    written = sweeper.store_changes(claimed)
    assert view.runner.follow(written) == 2  # from memory
    assert view.position() == written[-1].notification.id == sweeper.recorder.max_notification_id()
    owners = {e.obligation_id: e.owner for e in view.entries()}
    assert owners == {"o0": sweeper.owner, "o1": sweeper.owner, "o2": dead.owner, "o3": dead.owner}

    # Another writer's event between the view's position and the write: nothing is taken
    # from memory (nothing written), and the port's follow catches up instead.
    dead.record_obligation(
        obligation_id="o4", session_key="k", platform="telegram", chat_id="1", content="x"
    )
    third = sweeper.load("o2")
    third.claim(by=sweeper.owner, now=now, policy=POLICY)
    written = sweeper.store_changes([third])
    before = view.position()
    assert view.runner.follow(written) is None
    assert view.position() == before
    assert view.follow(written) == 2  # o4's record, then the claim

    # A recorded reply keeps its text sealed at rest: the view must see it as stored.
    fresh = sweeper.new_obligation(
        obligation_id="o5", session_key="k", platform="telegram", chat_id="1", content="x"
    )
    written = sweeper.store_changes([fresh])
    assert view.runner.follow(written) is None
    assert view.follow(written) == 1

    followed = view_snapshot(sweeper)
    assert [row[0] for row in followed] == [f"o{i}" for i in range(6)]
    view.rebuild()
    assert view_snapshot(sweeper) == followed


def test_rows_read_together_share_one_identity_per_owner(store_location: str) -> None:
    """A dead gateway's orphans have one owner: the sweep's read builds (and checks) it
    once; another owner's rows get their own."""
    first, second = dead_owner(), dead_owner()
    ids_a = record_orphans(store_location, 3, prefix="a", owner=first)
    ids_b = record_orphans(store_location, 3, prefix="b", owner=second)
    view = DeliveryLedger.open(store_location).recoverable
    view.catch_up()
    by_id = {e.obligation_id: e.owner for e in view.entries()}
    assert [by_id[oid] for oid in ids_a] == [first] * 3
    assert [by_id[oid] for oid in ids_b] == [second] * 3
    assert len({id(owner) for owner in by_id.values()}) == 2
