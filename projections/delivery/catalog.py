"""Every view of the ledger by name: its status, and a rebuild that proves it right.

The ledger holds its views (``recoverable``, ``obligation_index``); operators name them
(``projections status | rebuild --name N``). ``rebuild_and_verify`` replays the log from
scratch into a *shadow* copy of the view up to exactly the position the live view
reflects, then compares the two row by row. The live view keeps serving sweeps
meanwhile. Equal: the shadow is dropped and the live view is proven. Different: the live
view is rebuilt from the events (they are the truth) and the differences are reported.
"""

from __future__ import annotations

from typing import Protocol

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.projections.delivery.obligation_index import (
    INDEX_NAME,
    ObligationIndexView,
)
from gateway_ledger.projections.delivery.recoverable import VIEW_NAME, RecoverableView
from gateway_ledger.projections.view import (
    DEFAULT_BATCH_SIZE,
    MaterializedView,
    Progress,
    ProjectionStatus,
    RebuildReport,
)

__all__ = [
    "PROJECTION_NAMES",
    "SHADOW_SUFFIX",
    "LedgerViews",
    "ProjectionStatus",
    "RebuildReport",
    "projection_status",
    "rebuild_and_verify",
    "view_named",
]

PROJECTION_NAMES: tuple[str, ...] = (VIEW_NAME, INDEX_NAME)

SHADOW_SUFFIX = "_rebuild"
"""A shadow copy of view ``name`` is kept in ``<name>_rebuild`` while it is compared."""


class LedgerViews(Protocol):
    """What holds the ledger's views (the ledger itself)."""

    @property
    def recoverable(self) -> RecoverableView: ...
    @property
    def obligation_index(self) -> ObligationIndexView: ...


def view_named(ledger: LedgerViews, name: str) -> MaterializedView:
    """The ledger's view called ``name``."""
    if name == VIEW_NAME:
        return ledger.recoverable
    if name == INDEX_NAME:
        return ledger.obligation_index
    known = ", ".join(PROJECTION_NAMES)
    raise InvalidInput(f"no projection named {name!r} (known: {known})")


def projection_status(ledger: LedgerViews, name: str) -> ProjectionStatus:
    return view_named(ledger, name).status()


def rebuild_and_verify(
    ledger: LedgerViews,
    name: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild ``name`` from scratch into a shadow and prove it equals the live view."""
    return view_named(ledger, name).rebuild_and_verify(batch_size=batch_size, progress=progress)
