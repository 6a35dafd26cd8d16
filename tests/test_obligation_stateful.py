"""Random command sequences against a model of the legal transitions (ADR 0006).

Three ledgers with three different owners share one real store and drive one obligation:
record, attempt, deliver, fail (every classification), claim by another owner, abandon,
re-record. The model is written from the ADR, not from the aggregate. After every step the
aggregate, its history (event types in order, versions without gap) and a reload through
another application on the same store must agree with the model; a refused command raises
IllegalTransition and appends nothing.

The model keeps the duplicate marker with the rule's own function
(``domain/delivery/marker.py``), fed the fact each command states; the function itself is
checked against the ADR's wording ("some send that may have reached the user exists")
in ``tests/test_obligation_marker.py``. Every event that changes the marker must carry the
model's decision.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from conftest import drop_postgres_schema, new_postgres_url, require_postgres
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.marker import NOTHING_SENT, Marker, SendFact, marker_after
from gateway_ledger.domain.errors import ConflictingRecord, IllegalTransition, NotFound
from gateway_ledger.domain.values import (
    AbandonReason,
    ErrorClass,
    LedgerPolicy,
    OwnerIdentity,
    SendGuard,
)

OWNERS = [
    OwnerIdentity(host="gw-a", boot_id="b1", pid=101, start_time=11),
    OwnerIdentity(host="gw-b", boot_id="b1", pid=202, start_time=22),
    OwnerIdentity(host="gw-c", boot_id="b2", pid=303, start_time=33),
]
POLICY = LedgerPolicy()
OID = "0123456789abcdef01234567"
UNRESOLVED = {"pending", "attempting", "failed", "claimed"}

owner_index = st.integers(min_value=0, max_value=len(OWNERS) - 1)


@attrs.define
class Model:
    """What ADR 0006 says the obligation is, after the commands so far."""

    state: str | None = None
    owner: int | None = None
    fence: int = 0
    claims: int = 0  # the recovery attempts spent: claims whose send started (ADR 0070)
    claim_unsent: bool = False  # the last claim promised to record its send, and has not
    send_attempts: int = 0
    marker: Marker = NOTHING_SENT
    content: str | None = None  # what the first record said
    events: list[str] = attrs.Factory(list)
    decisions: list[bool | None] = attrs.Factory(list)  # the marker decision each carries
    unguarded_resends: int = 0  # sends recorded as guard "none" when the marker was due

    @property
    def needs_marker(self) -> bool:
        return self.marker.may_have_arrived

    def happened(self, event: str, fact: SendFact | None = None) -> None:
        """An event was appended; the marker follows the fact it states."""
        self.marker = marker_after(self.marker, fact)
        self.events.append(event)
        decision: bool | None = None
        if event in ("Attempting", "Claimed"):
            decision = self.marker.arrived_before_this_send
        elif event in ("Failed", "LateResultReported"):
            decision = self.marker.may_have_arrived
        self.decisions.append(decision)

    def fenced_out(self, by: int) -> bool:
        """ADR 0010: after a claim only the owner's results are transitions; others are late."""
        return self.state is not None and self.fence > 0 and by != self.owner

    def legal(self, command: str, by: int) -> bool:
        s = self.state
        if command == "record":
            return True  # recording is idempotent: never refused, never rewinds
        if s is None:
            return False
        if command == "attempt":
            return s in ("pending", "failed") and (self.fence == 0 or by == self.owner)
        if command in ("deliver", "fail"):
            return s in ("attempting", "claimed")
        if command == "claim":
            spent = self.claims >= POLICY.max_attempts and not self.claim_unsent
            return s in UNRESOLVED and by != self.owner and not spent
        if command == "start recovery send":
            return s == "claimed" and by == self.owner and self.claim_unsent
        if command == "abandon":
            return s in UNRESOLVED
        raise AssertionError(command)


class ObligationMachine(RuleBasedStateMachine):
    """Subclassed per store by :func:`machine_for`; ``new_location``/``drop`` set there."""

    new_location: Callable[[], str]
    drop: Callable[[str], None]

    def __init__(self) -> None:
        super().__init__()
        self.location = type(self).new_location()
        self.ledgers = [DeliveryLedger.open(self.location, owner=o, policy=POLICY) for o in OWNERS]
        self.reader = DeliveryLedger.open(self.location, owner=OWNERS[0], policy=POLICY)
        self.model = Model()

    def teardown(self) -> None:
        for app in [*self.ledgers, self.reader]:
            app.close()
        type(self).drop(self.location)

    # -- driving ------------------------------------------------------------------------------

    def _stored_count(self) -> int:
        """Events in the whole store (counted: PostgreSQL's notification ids have gaps)."""
        return len(self.reader.recorder.select_notifications(start=None, limit=10_000))

    def _run(self, command: str, by: int, action: Callable[[], object]) -> bool:
        """Run one command; check a refusal appended nothing. True when it was legal.

        Before the obligation is recorded every transition is NotFound, not illegal.
        """
        legal = self.model.legal(command, by)
        before = self._stored_count()
        if legal:
            action()
            return True
        if self.model.state is None:
            with pytest.raises(NotFound, match=OID):
                action()
        else:
            with pytest.raises(IllegalTransition) as refused:
                action()
            assert OID in str(refused.value) and self.model.state in str(refused.value)
        assert self._stored_count() == before
        return False

    @rule(by=owner_index, content=st.sampled_from(["hello", "nul\x00", "🙂" * 3]))
    def record(self, by: int, content: str) -> None:
        before = self._stored_count()
        call = lambda: self.ledgers[by].record_obligation(  # noqa: E731
            obligation_id=OID,
            session_key="agent:main:telegram:dm:1",
            platform="telegram",
            chat_id="1",
            content=content,
        )
        if self.model.state is None:
            call()
            self.model.state, self.model.owner = "pending", by
            self.model.content = content
            self.model.happened("Recorded")
            return
        if content == self.model.content:
            call()  # the same record again: idempotent
        else:
            # Another reply under the same id is a caller's bug, refused (issue 14).
            with pytest.raises(ConflictingRecord, match=OID):
                call()
        assert self._stored_count() == before  # nothing appended either way

    @rule(by=owner_index, guard=st.sampled_from([None, *SendGuard]))
    def attempt(self, by: int, guard: SendGuard | None) -> None:
        marker_due = self.model.needs_marker
        call = lambda: self.ledgers[by].mark_attempting(OID, guard=guard)  # noqa: E731
        if self._run("attempt", by, call):
            m = self.model
            m.unguarded_resends += guard is SendGuard.NONE and marker_due
            m.state, m.owner = "attempting", by
            m.send_attempts += 1
            m.happened("Attempting", SendFact.STARTED)

    def _late(self, by: int, action: Callable[[], object], delivered: bool) -> bool:
        """A fenced-out result is appended as LateResultReported; the state is untouched."""
        if not self.model.fenced_out(by):
            return False
        action()
        outcome = "delivered" if delivered else "failed"
        self.model.happened("LateResultReported", SendFact.late_result(outcome))
        history = self.reader.history(OID)
        assert history[-1].fields["late"] is True
        return True

    @rule(by=owner_index)
    def deliver(self, by: int) -> None:
        if self._late(by, lambda: self.ledgers[by].mark_delivered(OID, ["m-1"]), True):
            return
        if self._run("deliver", by, lambda: self.ledgers[by].mark_delivered(OID, ["m-1"])):
            self.model.state = "delivered"
            self.model.happened("Delivered")

    @rule(by=owner_index, classification=st.sampled_from(list(ErrorClass)))
    def fail(self, by: int, classification: ErrorClass) -> None:
        call = lambda: self.ledgers[by].mark_failed(OID, "boom", classification.value)  # noqa: E731
        if self._late(by, call, False):
            return
        if self._run("fail", by, call):
            self.model.state = "failed"
            self.model.claim_unsent = False  # a result of the claimer's send: it started
            self.model.happened("Failed", SendFact.failure(classification))

    @rule(by=owner_index, records_send=st.booleans())
    def claim(self, by: int, records_send: bool) -> None:
        ledger = self.ledgers[by]

        def call() -> None:
            obligation = ledger.load(OID)
            obligation.claim(
                by=ledger.owner, now=ledger.clock(), policy=ledger.policy, records_send=records_send
            )
            ledger.save_transition(obligation, "claimed")

        if self._run("claim", by, call):
            m = self.model
            m.state, m.owner = "claimed", by
            m.fence += 1
            m.claims += 0 if m.claim_unsent else 1  # an unsent claim's place is taken
            m.claim_unsent = records_send
            m.happened("Claimed", SendFact.STARTED)  # the marker: as if sent at once

    @rule(by=owner_index)
    def start_recovery_send(self, by: int) -> None:
        ledger = self.ledgers[by]

        def call() -> None:
            obligation = ledger.load(OID)
            obligation.start_recovery_send(by=ledger.owner, now=ledger.clock())
            ledger.save_transition(obligation, "recovery send started")

        if self._run("start recovery send", by, call):
            self.model.claim_unsent = False
            self.model.happened("RecoverySendStarted")

    @rule(by=owner_index, reason=st.sampled_from(list(AbandonReason)))
    def abandon(self, by: int, reason: AbandonReason) -> None:
        abandon = lambda: self.ledgers[by].abandon(OID, reason.value, "stateful test")  # noqa: E731
        if self._run("abandon", by, abandon):
            self.model.state = "abandoned"
            self.model.happened("Abandoned")

    # -- agreement ----------------------------------------------------------------------------

    @invariant()
    def aggregate_history_and_store_agree_with_the_model(self) -> None:
        m = self.model
        if m.state is None:
            assert not self.reader.exists(OID)
            return
        assert m.owner is not None
        for app in (self.ledgers[0], self.reader):  # a writer's view and a separate reader
            status = app.get(OID)
            assert status.state == m.state
            assert status.owner == OWNERS[m.owner]
            assert (status.fence, status.recovery_attempts) == (m.fence, m.claims)
            assert status.send_attempts == m.send_attempts
            assert status.needs_marker == m.needs_marker
            assert status.version == len(m.events)
        history = self.reader.history(OID)
        assert [h.type for h in history] == m.events
        carried = [h.fields.get("needs_marker", h.fields.get("may_have_arrived")) for h in history]
        assert carried == m.decisions  # each marker decision is on its event, as the rule says
        # ADR 0026: the audit flags exactly the sends recorded as unguarded when a marker
        # was due; a guard not said is taken as the rule followed.
        findings = self.reader.audit_duplicates().findings
        assert sum(f.kind == "unmarked_resend" for f in findings) == m.unguarded_resends
        assert [h.version for h in history] == list(range(1, len(m.events) + 1))
        assert self._stored_count() == len(m.events)


def machine_for(backend: str) -> type[ObligationMachine]:
    if backend == "sqlite":

        def new_location() -> str:
            return str(Path(tempfile.mkdtemp(prefix="gl-stateful-")) / "ledger.db")

        def drop(location: str) -> None:
            shutil.rmtree(Path(location).parent, ignore_errors=True)

    else:
        new_location, drop = new_postgres_url, drop_postgres_schema
    return type(
        f"ObligationMachine_{backend}",
        (ObligationMachine,),
        {"new_location": staticmethod(new_location), "drop": staticmethod(drop)},
    )


STATEFUL_SETTINGS = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_command_sequences_follow_the_model_on_sqlite() -> None:
    run_state_machine_as_test(machine_for("sqlite"), settings=STATEFUL_SETTINGS)


def test_command_sequences_follow_the_model_on_postgres() -> None:
    require_postgres()
    run_state_machine_as_test(machine_for("postgres"), settings=STATEFUL_SETTINGS)
