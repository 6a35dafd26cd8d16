"""Which sessions may leave the hot store, and what stays of them (ADR 0053).

One rule: a session is prunable only when it has ended (its last lifecycle event is its
``Reset``), it is no longer the current session of any key, and it ended before the
cut-off. A current session, a reopened one, or a state this release does not recognise
stays. What stays of a pruned session is its :class:`SessionTombstone`: ids, times and
counts, no personal data (no key, no source, no text).
"""

from __future__ import annotations

from datetime import datetime

import attrs

ENDED = "ended"
"""The one lifecycle state that may be pruned; every other one (open, reopened, a newer
release's) stays."""


def is_session_prunable(
    state: str, *, current: bool, ended_at: datetime | None, cutoff: datetime
) -> bool:
    """The one session retention rule: ended, no key's current session, ended before
    ``cutoff``."""
    return state == ENDED and not current and ended_at is not None and ended_at < cutoff


@attrs.frozen
class SessionTombstone:
    """What stays in the hot store of a pruned session (no personal data). ``archive``
    is the file its events went to, ``""`` when the operator had them deleted."""

    session_id: str
    aggregate_id: str
    end_reason: str | None
    created_at: datetime
    ended_at: datetime
    events: int
    pruned_at: datetime
    archive: str
