"""The one retention rule (domain/delivery/retention.py): only final, readable
obligations resolved before the cut-off may leave the hot store; every other state,
known or not, stays. And the dead letter's retry (``retry_dead_letter``), and the session
rule (domain/sessions/retention.py): only an ended session no key holds, ended before the
cut-off."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.delivery.retention import PRUNABLE_STATES, is_prunable
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.sessions.retention import ENDED, is_session_prunable
from gateway_ledger.domain.values import (
    QUARANTINED,
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
)

CUTOFF = datetime(2026, 6, 1, tzinfo=UTC)
BEFORE = CUTOFF - timedelta(microseconds=1)


def test_only_delivered_and_abandoned_are_prunable() -> None:
    assert {"delivered", "abandoned"} == PRUNABLE_STATES
    for state in ObligationState:
        expected = state.is_final
        assert is_prunable(state.value, quarantined=False, resolved_at=BEFORE, cutoff=CUTOFF) is (
            expected
        ), state


@given(st.text(min_size=0, max_size=20).filter(lambda s: s not in PRUNABLE_STATES))
def test_a_state_this_release_does_not_know_is_never_pruned(state: str) -> None:
    assert not is_prunable(state, quarantined=False, resolved_at=BEFORE, cutoff=CUTOFF)


def test_quarantined_and_recent_ones_stay() -> None:
    for state in PRUNABLE_STATES:
        assert not is_prunable(state, quarantined=True, resolved_at=BEFORE, cutoff=CUTOFF)
        assert not is_prunable(state, quarantined=False, resolved_at=CUTOFF, cutoff=CUTOFF)
        assert is_prunable(state, quarantined=False, resolved_at=BEFORE, cutoff=CUTOFF)
    assert not is_prunable(QUARANTINED, quarantined=True, resolved_at=BEFORE, cutoff=CUTOFF)
    assert not is_prunable("reconciled", quarantined=False, resolved_at=BEFORE, cutoff=CUTOFF)


# -- a dead letter retried (DeliveryObligation.retry_dead_letter) -------------------------------

A = OwnerIdentity(host="h", boot_id="b", pid=1, start_time=1, installation_id="i")
B = OwnerIdentity(host="h", boot_id="b", pid=2, start_time=1, installation_id="i")
OPS = OwnerIdentity(host="ops", boot_id="b", pid=3, start_time=1, installation_id="i")
T = datetime(2026, 3, 1, tzinfo=UTC)


def abandoned_after_a_claim() -> DeliveryObligation:
    """Sent by A, rate-limited (a retry_after), claimed by B, abandoned: every field the
    retry resets is set."""
    ob = DeliveryObligation.record(
        obligation_id="dl-1",
        session_key="agent:main:telegram:dm:1",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="hello",
        owner=A,
        now=T,
    )
    ob.start_attempt(by=A, now=T + timedelta(seconds=1))
    ob.fail(
        by=A,
        now=T + timedelta(seconds=2),
        error="slow down",
        classification=ErrorClass.AMBIGUOUS,
        retry_after=30.0,
    )
    ob.claim(by=B, now=T + timedelta(seconds=3), policy=LedgerPolicy())
    ob.abandon(reason=AbandonReason.STALE, now=T + timedelta(seconds=4), by=B, detail="old")
    assert ob.recovery_attempts == 1 and ob.retry_after is not None and ob.fence == 1
    return ob


def test_a_dead_letter_retried_is_owed_again_by_the_operator() -> None:
    ob = abandoned_after_a_claim()
    marker = ob.needs_marker
    ob.collect_events()
    now = T + timedelta(hours=1)
    ob.retry_dead_letter(by=OPS, now=now, requested_by="alice")
    (event,) = ob.collect_events()
    assert isinstance(event, DeliveryObligation.DeadLetterRetried)
    assert (event.by, event.previous_owner, event.requested_by, event.fence) == (OPS, B, "alice", 2)
    assert (event.obligation_id, event.platform, event.recorded_at) == ("dl-1", "telegram", T)
    assert ob.state is ObligationState.PENDING
    assert (ob.owner, ob.fence, ob.recovery_attempts) == (OPS, 2, 0)
    assert ob.retry_after is None and ob.abandon_reason is None
    assert ob.last_transition_at == now and ob.needs_marker == marker


def test_only_a_readable_abandoned_reply_is_a_dead_letter_to_retry() -> None:
    ob = abandoned_after_a_claim()
    with pytest.raises(InvalidInput):
        ob.retry_dead_letter(by=OPS, now=T, requested_by="")  # who asked is required
    with pytest.raises(InvalidInput):
        ob.retry_dead_letter(by=OPS, now=T.replace(tzinfo=None), requested_by="alice")
    ob.retry_dead_letter(by=OPS, now=T, requested_by="alice")
    with pytest.raises(IllegalTransition):
        ob.retry_dead_letter(by=OPS, now=T, requested_by="alice")  # pending now
    fresh = DeliveryObligation.record(
        obligation_id="dl-2",
        session_key="s",
        target=DeliveryTarget(platform="x", chat_id="1"),
        content="x",
        owner=A,
        now=T,
    )
    fresh.quarantine(reason=QuarantineReason.UNREADABLE, found_at=1, by=A, now=T)
    fresh.abandon(reason=AbandonReason.OPERATOR, now=T, by=A, detail="unreadable")
    with pytest.raises(IllegalTransition):
        fresh.retry_dead_letter(by=OPS, now=T, requested_by="alice")  # never sent unreadable


def test_abandoned_carries_the_last_error_class_and_upcasts_version_1() -> None:
    ob = abandoned_after_a_claim()
    abandoned = ob.collect_events()[-1]
    assert isinstance(abandoned, DeliveryObligation.Abandoned)
    assert abandoned.error_class == "ambiguous"
    assert DeliveryObligation.Abandoned.class_version == 2
    never_failed = DeliveryObligation.record(
        obligation_id="dl-3",
        session_key="s",
        target=DeliveryTarget(platform="x", chat_id="1"),
        content="x",
        owner=A,
        now=T,
    )
    never_failed.abandon(reason=AbandonReason.OPERATOR, now=T, by=A, detail="stop")
    assert never_failed.collect_events()[-1].error_class is None
    state: dict[str, object] = {"reason": "stale", "detail": "", "by": None}
    DeliveryObligation.Abandoned.upcast_v1_v2(state)
    assert state == {"reason": "stale", "detail": "", "by": None, "error_class": None}


# -- the session rule (domain/sessions/retention.py) ------------------------------------------


def test_a_session_is_prunable_only_ended_not_current_and_ended_before_the_cutoff() -> None:
    assert ENDED == "ended"  # the archive's state of a pruned session (ADR 0053)
    assert is_session_prunable(ENDED, current=False, ended_at=BEFORE, cutoff=CUTOFF)
    assert not is_session_prunable(ENDED, current=True, ended_at=BEFORE, cutoff=CUTOFF)
    assert not is_session_prunable(ENDED, current=False, ended_at=CUTOFF, cutoff=CUTOFF)
    assert not is_session_prunable(ENDED, current=False, ended_at=None, cutoff=CUTOFF)
    assert not is_session_prunable("open", current=False, ended_at=BEFORE, cutoff=CUTOFF)


@given(
    st.text(max_size=12),
    st.booleans(),
    st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))),
)
def test_no_current_or_unknown_session_state_is_ever_prunable(
    state: str, current: bool, ended_at: datetime | None
) -> None:
    prunable = is_session_prunable(state, current=current, ended_at=ended_at, cutoff=CUTOFF)
    if current or state != ENDED or ended_at is None or ended_at >= CUTOFF:
        assert not prunable
    else:
        assert prunable
