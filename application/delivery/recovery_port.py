"""The two things ``Gateway.start`` needs from the rest of gateway-ledger, as small seams.

- a recovery sweep with the upstream signature (issue 3's ``DeliveryLedger.sweep_recoverable``);
- a session store that can clear an interrupted conversation's resume flag (issue 4).

The sweep defaults to the ledger's own; without a session store nothing is resumed or
cleared.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any, Protocol, runtime_checkable


class RecoverySweep(Protocol):
    def __call__(
        self, now: datetime | None = None, *, deliverable_platforms: Collection[str] | None = None
    ) -> list[dict[str, Any]]: ...


@runtime_checkable
class ResumableSessions(Protocol):
    """What the gateway needs from a session store at boot."""

    def clear_resume(self, session_key: str, now: datetime) -> None:
        """The turn's reply is owed and being redelivered: do not re-run the turn."""

    def pending_resumes(self, now: datetime) -> list[str]:
        """Session keys of interrupted conversations that should auto-continue now."""


class SessionStoreResume:
    """:class:`ResumableSessions` over the ``SessionStore`` (issue 4).

    The store decides auto-continue in ``resolve`` (freshness window), so nothing is listed
    here: once ``start`` returns, the gateway resolves its interrupted conversations as usual
    and only those whose reply was *not* owed in the ledger still carry the resume flag.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def clear_resume(self, session_key: str, now: datetime) -> None:
        route = self.store.route_of(session_key)
        if route is None:
            return
        session = self.store.load_session(route.session_id)
        if session.resume_pending:
            self.store.clear_resume_pending(route.session_id, now=now)

    def pending_resumes(self, now: datetime) -> list[str]:
        return []
