"""The operators' Python API on both stores: stats, list, history at, retry, audit, rebuild."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta

import orjson
import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.projections.delivery.catalog import PROJECTION_NAMES, rebuild_and_verify
from tests.operator_support import owner, plant_late_delivery, plant_unmarked_resend, record


def test_stats_and_list_follow_the_index(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_001))
    for i in range(4):
        record(ledger, f"o{i}", key=f"agent:main:telegram:dm:{i % 2}")
    ledger.mark_attempting("o0")
    ledger.mark_delivered("o0", ["m"])
    ledger.mark_attempting("o1")
    ledger.mark_failed("o1", "bad request", "rejected")
    ledger.abandon("o2", "operator", "asked to stop")
    stats = ledger.stats()
    assert stats.total == 4 and stats.unresolved == 2
    assert stats.by_state["delivered"] == 1 and stats.by_state["failed"] == 1
    assert stats.by_platform["telegram"]["pending"] == 1
    assert stats.abandoned_by_reason["operator"] == 1
    assert stats.delivery_seconds.count == 1 and stats.delivery_seconds.max is not None
    assert stats.oldest_unresolved_id == "o1"
    index = {p.name: p for p in stats.projections}["obligation_index"]
    assert index.lag == 0 and index.rows == 4
    mine = ledger.list(session="agent:main:telegram:dm:1")
    assert [e.obligation_id for e in mine] == ["o1", "o3"]
    assert [e.obligation_id for e in ledger.list(state="failed")] == ["o1"]
    assert ledger.list(platform="discord") == ()
    first = ledger.list()[0]
    assert ledger.list(since=first.recorded_at + timedelta(days=1)) == ()
    with pytest.raises(InvalidInput):
        ledger.list(state="lost")


def test_history_at_replays_to_a_past_moment(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_002))
    record(ledger, "h")
    ledger.mark_attempting("h")
    ledger.mark_failed("h", "timeout", "ambiguous")
    ledger.mark_attempting("h")
    ledger.mark_delivered("h", ["m"])
    entries = ledger.history("h")
    past = ledger.history("h", at=entries[2].timestamp)
    assert [e.type for e in past.entries] == ["Recorded", "Attempting", "Failed"]
    assert past.status.state == "failed" and past.status.needs_marker
    assert past.later_events == 2
    with pytest.raises(InvalidInput):
        ledger.history("h", at=entries[0].timestamp - timedelta(seconds=1))


def test_retry_refused_on_final_and_claimable_after(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_003))
    record(ledger, "done")
    ledger.mark_attempting("done")
    ledger.mark_delivered("done")
    with pytest.raises(IllegalTransition, match="refused retry requested"):
        ledger.retry("done", "alice")
    with pytest.raises(IllegalTransition):
        ledger.abandon("done", "operator", "no")
    record(ledger, "stuck")
    ledger.mark_attempting("stuck")
    status = ledger.retry("stuck", "alice")
    assert status.state == "pending" and status.fence == 1 and status.needs_marker
    # The retrying process is the operator's: a gateway's sweep takes it once that is gone.
    gateway = DeliveryLedger.open(store_location)
    won = gateway.sweep_recoverable(liveness=lambda o: o == gateway.owner)
    assert [w["obligation_id"] for w in won] == ["stuck"] and won[0]["needs_marker"]


def test_audit_flags_planted_histories_and_nothing_else(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_004))
    record(ledger, "clean")
    ledger.mark_attempting("clean")
    ledger.mark_failed("clean", "timeout", "ambiguous")
    ledger.mark_attempting("clean")
    ledger.mark_delivered("clean")
    clean = ledger.audit_duplicates()
    assert clean.ok and clean.labelled_duplicates == 1 and clean.unlabelled_duplicates == 0
    late = plant_late_delivery(store_location)
    unmarked = plant_unmarked_resend(store_location)
    report = ledger.audit_duplicates()
    assert not report.ok
    found = {(f.kind, f.obligation_id) for f in report.findings}
    for finding in report.findings:  # operators read when, as a time, not an encoding
        assert datetime.fromisoformat(finding.timestamp).tzinfo is not None
    assert found == {
        ("late_result", late),
        ("claim_from_live_owner", late),
        ("unmarked_resend", unmarked),
    }
    assert report.counts()["double_claim"] == 0


def test_audit_reads_the_guard_a_send_recorded(store_location: str) -> None:
    """A re-send recorded as unguarded is flagged even though the history asked for the
    marker; recorded guards count as labels; a send that said nothing is inferred."""
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_008))
    for oid, second in (("plain", "none"), ("marked", "marker"), ("keyed", "idempotency_key")):
        record(ledger, oid)
        agg = ledger.load(oid)
        agg.start_attempt(by=ledger.owner, now=agg.last_transition_at, guard="none")
        agg.fail(by=ledger.owner, now=agg.last_transition_at, error="timeout")
        agg.start_attempt(by=ledger.owner, now=agg.last_transition_at, guard=second)
        agg.confirm_delivery(by=ledger.owner, now=agg.last_transition_at)
        ledger.save(agg)
    record(ledger, "unsaid")  # the synchronous API: no guard recorded, the rule is assumed
    ledger.mark_attempting("unsaid")
    ledger.mark_failed("unsaid", "timeout", "ambiguous")
    ledger.mark_attempting("unsaid")
    ledger.mark_delivered("unsaid")
    report = ledger.audit_duplicates()
    assert [(f.kind, f.obligation_id) for f in report.findings] == [("unmarked_resend", "plain")]
    labelled = {d.obligation_id: d.labelled for d in report.possible_duplicates}
    assert labelled == {"plain": False, "marked": True, "keyed": True, "unsaid": True}
    attempts = [h for h in ledger.history("marked") if h.type == "Attempting"]
    assert [h.fields["guard"] for h in attempts] == ["none", "marker"]


def test_attempts_stored_before_guards_were_recorded_still_load_and_are_inferred(
    sqlite_location: str,
) -> None:
    ledger = DeliveryLedger.open(sqlite_location, owner=owner(4_200_009))
    record(ledger, "old")
    ledger.mark_attempting("old")
    ledger.mark_failed("old", "timeout", "ambiguous")
    ledger.mark_attempting("old")
    ledger.close()
    with sqlite3.connect(sqlite_location) as conn:  # as written before ADR 0026
        rows = conn.execute(
            "SELECT rowid, state FROM stored_events WHERE topic LIKE '%.Attempting'"
        ).fetchall()
        assert len(rows) == 2
        for rowid, state in rows:
            data = orjson.loads(state)
            assert data.pop("guard") is None
            conn.execute(
                "UPDATE stored_events SET state = ? WHERE rowid = ?", (orjson.dumps(data), rowid)
            )
    ledger = DeliveryLedger.open(sqlite_location, owner=owner(4_200_009))
    ledger.mark_delivered("old")
    assert ledger.get("old").state == "delivered"
    attempts = [h for h in ledger.history("old") if h.type == "Attempting"]
    assert len(attempts) == 2 and all("guard" not in h.fields for h in attempts)
    report = ledger.audit_duplicates()
    assert report.ok and report.labelled_duplicates == 1
    ledger.close()


def test_audit_follows_the_aggregate_when_another_process_reports_the_failure(
    store_location: str,
) -> None:
    """Before any claim, any process may report a result (the upstream API has no owner
    check): the aggregate takes a definite refusal as one of the current send, so the
    claim that follows needs no marker. The audit used to pin the refusal on the
    reporter's own sends, then flag the claim as unmarked and the report as late.
    (Found by the state-machine test.)"""
    sender = DeliveryLedger.open(store_location, owner=owner(4_200_010))
    other = DeliveryLedger.open(store_location, owner=owner(4_200_011))
    record(sender, "refused")
    sender.mark_attempting("refused")
    other.mark_failed("refused", "chat not writable", "rejected")
    agg = other.load("refused")
    assert agg.needs_marker is False  # the refused send never arrived
    agg.claim(by=other.owner, now=agg.last_transition_at, policy=other.policy)
    other.save(agg)
    claimed = [h for h in other.history("refused") if h.type == "Claimed"]
    assert claimed[0].fields["needs_marker"] is False
    report = other.audit_duplicates()
    assert report.findings == ()
    assert report.possible_duplicates == ()
    sender.close()
    other.close()


def test_audit_flags_a_second_claim_at_the_same_fence(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_005))
    record(ledger, "twice")
    ledger.mark_attempting("twice")
    agg = ledger.load("twice")
    now = agg.last_transition_at + timedelta(seconds=1)
    for claimer in (owner(4_200_006), owner(4_200_007)):
        agg.trigger_event(  # forged claims: no guard would let them through
            DeliveryObligation.Claimed,
            by=claimer,
            previous_owner=agg.owner,
            recovery_attempt=1,
            needs_marker=True,
            fence=1,
            timestamp=now,
        )
    ledger.save(agg)
    kinds = [f.kind for f in ledger.audit_duplicates().findings]
    assert kinds == ["double_claim"]


@pytest.mark.parametrize("name", PROJECTION_NAMES)
def test_rebuild_equals_the_incremental_view(store_location: str, name: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(4_200_008))
    for i in range(3):
        record(ledger, f"r{i}")
    ledger.mark_attempting("r0")
    ledger.retry("r0", "bob")
    ledger.stats()
    ledger.recoverable.catch_up()
    plant_late_delivery(store_location)
    report = rebuild_and_verify(ledger, name, batch_size=2)
    assert report.equal and not report.repaired and report.events_replayed > 0
