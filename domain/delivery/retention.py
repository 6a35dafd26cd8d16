"""Which obligations may leave the hot store, and what stays of them (ADR 0053).

Only an obligation whose state is known to be final (delivered, abandoned) and not
quarantined may be pruned; any other state, including one this release does not know
(a newer release's, another capability's), is unresolved and stays. What stays of a
pruned obligation is its :class:`Tombstone`: ids, final state, times and counts, no
personal data.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from gateway_ledger.domain.values import ObligationState

PRUNABLE_STATES: frozenset[str] = frozenset(
    {ObligationState.DELIVERED.value, ObligationState.ABANDONED.value}
)
"""The final states. Everything else, known or not, is never pruned."""


def is_prunable(state: str, *, quarantined: bool, resolved_at: datetime, cutoff: datetime) -> bool:
    """The one retention rule: final, readable, and resolved before ``cutoff``."""
    return state in PRUNABLE_STATES and not quarantined and resolved_at < cutoff


@attrs.frozen
class Tombstone:
    """What stays in the hot store of a pruned obligation (no personal data)."""

    obligation_id: str
    aggregate_id: str
    state: str
    platform: str
    recorded_at: datetime
    resolved_at: datetime
    send_attempts: int
    error_class: str | None
    abandon_reason: str | None
    events: int
    pruned_at: datetime
    archive: str
