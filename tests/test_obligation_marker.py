"""The duplicate-marker rule (ADR 0006), one function, and the decisions events carry.

``marker_after`` is checked against the ADR's own wording on random sequences of facts:
the marker is due when "some send that may have reached the user exists", a send being
struck off only by a refusal of that very send, and a fenced-out owner's late success
proves an arrival. Then, on random command sequences run through the pure aggregate, every
event's recorded decision is what the function derives, and a replay of the same history
written before events carried decisions (the fields absent, as the mapper reads an old
store) gives the same marker after every event.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.marker import NOTHING_SENT, Marker, SendFact, marker_after
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    OwnerIdentity,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNERS = [OwnerIdentity(host=f"gw-{n}", boot_id="b", pid=10 + n, start_time=n) for n in range(3)]
facts = st.lists(st.sampled_from([None, *SendFact]), max_size=30)


@attrs.define
class AdrModel:
    """ADR 0006 in its own words: a list of sends, each may have arrived until refused."""

    sends: list[bool] = attrs.Factory(list)
    proven: bool = False  # a fenced-out owner's send was delivered

    def saw(self, fact: SendFact | None) -> None:
        if fact is SendFact.STARTED:
            self.sends.append(True)
        elif fact is SendFact.REFUSED and self.sends:
            self.sends[-1] = False  # the send in flight, and only it
        elif fact is SendFact.ARRIVED_LATE:
            self.proven = True
        elif fact is SendFact.NOT_ARRIVED:  # the platform covered every send: none arrived
            self.sends = [False for _ in self.sends]
            self.proven = False
        elif fact is SendFact.EARLIER_NOT_ARRIVED:  # all but the claim's send, still to go
            self.sends = [False for _ in self.sends[:-1]] + [True]
            self.proven = False

    @property
    def marker_due(self) -> bool:
        return any(self.sends) or self.proven

    @property
    def due_before_the_send_in_flight(self) -> bool:
        return any(self.sends[:-1]) or self.proven


@given(facts)
def test_the_rule_is_the_adr_in_its_own_words(history: list[SendFact | None]) -> None:
    model, marker = AdrModel(), NOTHING_SENT
    for fact in history:
        model.saw(fact)
        marker = marker_after(marker, fact)
        assert marker.may_have_arrived == model.marker_due
        assert marker.arrived_before_this_send == model.due_before_the_send_in_flight


def test_each_fact_in_turn() -> None:
    sent = marker_after(NOTHING_SENT, SendFact.STARTED)
    assert sent == Marker(may_have_arrived=True, arrived_before_this_send=False)
    assert marker_after(sent, SendFact.REFUSED) == NOTHING_SENT
    assert marker_after(sent, SendFact.UNCERTAIN) == sent
    assert marker_after(sent, None) == sent
    resent = marker_after(sent, SendFact.STARTED)
    assert resent == Marker(True, True)
    assert marker_after(resent, SendFact.REFUSED) == Marker(True, True)  # the first may have
    assert marker_after(sent, SendFact.ARRIVED_LATE) == Marker(True, True)
    assert marker_after(NOTHING_SENT, SendFact.REFUSED) == NOTHING_SENT


def test_a_recorded_decision_is_taken_as_recorded() -> None:
    """What an event carries is the decision; the function derives only what is missing."""
    assert marker_after(NOTHING_SENT, SendFact.STARTED, True) == Marker(True, True)
    assert marker_after(Marker(True, True), SendFact.STARTED, False) == Marker(True, False)
    assert marker_after(Marker(True, False), SendFact.UNCERTAIN, False) == Marker(False, False)
    assert marker_after(Marker(True, True), SendFact.REFUSED, False) == Marker(False, True)
    assert marker_after(Marker(True, False), SendFact.REFUSED, True) == Marker(True, False)
    assert marker_after(NOTHING_SENT, SendFact.ARRIVED_LATE, False) == NOTHING_SENT
    assert marker_after(NOTHING_SENT, None, True) == NOTHING_SENT  # no fact: nothing to decide


def test_what_failures_and_late_results_say() -> None:
    assert SendFact.failure(ErrorClass.AMBIGUOUS) is SendFact.UNCERTAIN
    for definite in (ErrorClass.REJECTED, ErrorClass.RATE_LIMITED, ErrorClass.DEAD_TARGET):
        assert SendFact.failure(definite) is SendFact.REFUSED
    assert SendFact.late_result("delivered") is SendFact.ARRIVED_LATE
    assert SendFact.late_result("failed") is None
    assert SendFact.late_result("part_delivered") is None


# -- the aggregate: recorded decisions, and the same history as written before ------------

commands = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "attempt",
                "deliver",
                "fail",
                "claim",
                "claim_gone",
                "retry",
                "part",
                "abandon",
                "late_fence",
                "reconcile_arrived",
                "reconcile_not_arrived",
                "reconcile_unknown",
                "failed_after_acceptance",
            ]
        ),
        st.integers(min_value=0, max_value=len(OWNERS) - 1),
        st.sampled_from(list(ErrorClass)),
    ),
    max_size=25,
)


def run(script: list[tuple[str, int, ErrorClass]]) -> DeliveryObligation:
    """Drive one pure obligation; a refused command changes nothing and is skipped."""
    agg = DeliveryObligation.record(
        obligation_id="o-1",
        session_key="k",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="ab",
        parts=["a", "b"],
        owner=OWNERS[0],
        now=T0,
    )
    for step, (command, who, classification) in enumerate(script, start=1):
        by, now = OWNERS[who], T0 + timedelta(seconds=step)
        try:
            if command == "attempt":
                agg.start_attempt(by=by, now=now)
            elif command == "deliver":
                agg.confirm_delivery(by=by, now=now, receipt=["m"])
            elif command == "fail":
                agg.fail(by=by, now=now, error="x", classification=classification)
            elif command in ("claim", "claim_gone"):
                gone = command == "claim_gone"
                agg.claim(
                    by=by, now=now, policy=LedgerPolicy(max_attempts=9), previous_owner_gone=gone
                )
            elif command == "retry":
                agg.request_retry(by=by, now=now, requested_by="ops")
            elif command == "part":
                agg.acknowledge_part(by=by, now=now, index=0, receipt=["p"])
            elif command == "abandon":
                agg.abandon(reason=AbandonReason.STALE, now=now, by=by)
            elif command.startswith("reconcile_"):
                outcome = command.removeprefix("reconcile_")
                ids = ["r"] if outcome == "arrived" else []
                part = 0 if outcome == "arrived" and not agg.part_delivered(0) else None
                agg.reconcile(by=by, now=now, outcome=outcome, message_ids=ids, part=part)
            elif command == "failed_after_acceptance":
                agg.report_status(status=command, at=now, now=now)
            else:  # a result from a send started under an older fence
                agg.fail(by=by, now=now, classification=classification, fence=agg.fence - 1)
        except (IllegalTransition, ValueError):
            pass
    return agg


ADDED_TO = (
    DeliveryObligation.Attempting,
    DeliveryObligation.Failed,
    DeliveryObligation.LateResultReported,
)
"""The event types whose marker decision was added as an optional field (``Claimed`` has
always carried its ``needs_marker``)."""


def as_written_before(event: Any) -> Any:
    """The event as the mapper reads it from a store written before events carried the
    marker decision: the optional field is absent from its state."""
    if not isinstance(event, ADDED_TO):
        return event
    field = type(event).marker_decision
    assert {f.name: f.default for f in dataclasses.fields(event)}[field] is None
    legacy: Any = object.__new__(type(event))
    object.__setattr__(legacy, "__dict__", {k: v for k, v in vars(event).items() if k != field})
    return legacy


def replay(events: list[Any]) -> list[Marker]:
    aggregate: Any = None
    markers = []
    for event in events:
        aggregate = event.mutate(aggregate)
        markers.append(aggregate.marker)
    return markers


@settings(max_examples=200)
@given(commands)
def test_recorded_decisions_are_the_rules_and_old_histories_read_the_same(
    script: list[tuple[str, int, ErrorClass]],
) -> None:
    agg = run(script)
    events: list[Any] = list(agg.collect_events())
    live = replay(events)
    assert live[-1] == agg.marker

    # Each event's decision is what the function derives from the marker before it.
    before = NOTHING_SENT
    for event, after in zip(events, live, strict=True):
        fact = type(event).send_fact(vars(event))
        assert after == marker_after(before, fact)
        if type(event).marker_decision:
            assert getattr(event, type(event).marker_decision) is not None  # always carried
        before = after

    # The same history, written before Attempting, Failed and LateResultReported carried
    # the decision: derived once, by the same function, to the same answer.
    legacy = [as_written_before(e) for e in events]
    for old in legacy:
        if isinstance(old, ADDED_TO):
            assert type(old).marker_decision not in vars(old)
    assert replay(legacy) == live


def test_old_events_without_the_field_read_as_not_said() -> None:
    agg = run([("attempt", 0, ErrorClass.AMBIGUOUS), ("fail", 0, ErrorClass.REJECTED)])
    attempting, failed = agg.collect_events()[1:]
    assert (attempting.needs_marker, failed.may_have_arrived) == (False, False)
    old_attempting, old_failed = as_written_before(attempting), as_written_before(failed)
    assert (old_attempting.needs_marker, old_failed.may_have_arrived) == (None, None)
    assert old_attempting.marker_after(Marker(True, False)) == Marker(True, True)  # derived
    assert attempting.marker_after(Marker(True, False)) == Marker(True, False)  # as recorded


def test_the_aggregate_follows_each_recorded_decision_even_against_the_rule() -> None:
    """Each event carries its decision and the aggregate takes it as carried, so a reader
    of the events and the aggregate agree whatever wrote them. Forged events (no command
    writes these) with decisions the rule would not make show which field each type reads.
    """
    agg = run([])
    at = T0 + timedelta(seconds=1)
    forged: list[tuple[type[Any], dict[str, Any], Marker]] = [
        (DeliveryObligation.Attempting, {"fence": 0, "needs_marker": True}, Marker(True, True)),
        (
            DeliveryObligation.Failed,
            {
                "error": "",
                "classification": "rejected",
                "retry_after": None,
                "fence": 0,
                "may_have_arrived": False,
            },
            Marker(False, True),
        ),
        (
            DeliveryObligation.Claimed,
            {
                "previous_owner": OWNERS[0],
                "recovery_attempt": 1,
                "needs_marker": True,
                "fence": 1,
            },
            Marker(True, True),
        ),
        (
            DeliveryObligation.LateResultReported,
            {
                "outcome": "delivered",
                "receipt": [],
                "error": "",
                "classification": None,
                "part": None,
                "fence": 0,
                "current_fence": 1,
                "late": True,
                "may_have_arrived": False,
            },
            Marker(False, True),
        ),
    ]
    for kind, fields, expected in forged:
        derived = marker_after(agg.marker, kind.send_fact(fields))
        agg.trigger_event(kind, by=OWNERS[1], timestamp=at, **fields)
        assert agg.marker == expected != derived, kind.__name__
    assert replay(list(agg.collect_events()))[-1] == agg.marker


# -- the audit judges sends by the same rule ------------------------------------------------


def _forge_send(ledger: DeliveryLedger, oid: str, needs_marker: bool | None) -> None:
    """Append an Attempting by the owner with this recorded decision and no guard said,
    whatever the rule says (no command would)."""
    agg = ledger.load(oid)
    agg.trigger_event(
        DeliveryObligation.Attempting,
        by=agg.owner,
        fence=agg.fence,
        guard=None,
        needs_marker=needs_marker,
        timestamp=agg.last_transition_at + timedelta(seconds=1),
    )
    ledger.save(agg)


@pytest.mark.parametrize(
    ("recorded", "flagged"),
    [(False, 1), (True, 0), (None, 0)],  # None: written before sends recorded it
)
def test_the_audit_judges_a_send_by_its_recorded_decision_against_the_rule(
    tmp_path: Path, recorded: bool | None, flagged: int
) -> None:
    ledger = DeliveryLedger.open(str(tmp_path / "ledger.db"), owner=OWNERS[0])
    try:
        ledger.record_obligation(
            obligation_id="o-1", session_key="k", platform="telegram", chat_id="1", content="hi"
        )
        ledger.mark_attempting("o-1")
        ledger.mark_failed("o-1", "timeout after the request left", "ambiguous")
        _forge_send(ledger, "o-1", recorded)  # the rule: the marker was due
        findings = ledger.audit_duplicates().findings
        assert [f.kind for f in findings] == ["unmarked_resend"] * flagged
        assert [f.version for f in findings] == [4] * flagged
    finally:
        ledger.close()


def test_the_audit_and_the_aggregate_agree_on_a_refusal_after_a_claim(tmp_path: Path) -> None:
    """A's send may have arrived; B claims and its own send is refused: the marker stays
    due (the refusal answers B's send only), so B's plain re-send is flagged."""
    location = str(tmp_path / "ledger.db")
    a = DeliveryLedger.open(location, owner=OWNERS[0])
    b = DeliveryLedger.open(location, owner=OWNERS[1])
    try:
        a.record_obligation(
            obligation_id="o-2", session_key="k", platform="telegram", chat_id="1", content="hi"
        )
        a.mark_attempting("o-2")
        agg = b.load("o-2")
        agg.claim(by=OWNERS[1], now=agg.last_transition_at, policy=LedgerPolicy())
        b.save(agg)
        b.mark_failed("o-2", "refused", "rejected")
        assert b.get("o-2").needs_marker is True
        b.mark_attempting("o-2", guard="none")
        assert [f.kind for f in b.audit_duplicates().findings] == ["unmarked_resend"]
    finally:
        a.close()
        b.close()
