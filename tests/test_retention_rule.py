"""The one retention rule (domain/delivery/retention.py): only final, readable
obligations resolved before the cut-off may leave the hot store; every other state,
known or not, stays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from gateway_ledger.domain.delivery.retention import PRUNABLE_STATES, is_prunable
from gateway_ledger.domain.values import QUARANTINED, ObligationState

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
