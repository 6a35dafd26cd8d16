"""``prune --sessions``: ended sessions older than a cut-off leave the hot store (ADR 0053).

The session lifecycles are read from the log (each session's ``Started``, ``Reset`` and
``Reopened``, each key's route events for its current session); the rule of what may go
is the domain's (``domain/sessions/retention.py``). In batches: the batch's streams are
read as stored and appended to the archive (durably) unless the operator asked for them
to be deleted, then removed with their snapshots and replaced by tombstones in one
transaction of the store (``SessionRetentionStore.remove``), which re-checks that each
stream still ends at its ``Reset`` and keeps any that changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import attrs
from eventsourcing.utils import get_topic

from gateway_ledger.application.sessions.store import SessionsApplication
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.retention import ENDED, SessionTombstone, is_session_prunable
from gateway_ledger.domain.sessions.route import SessionRoute
from gateway_ledger.domain.sessions.session import Session

log = logging.getLogger("gateway_ledger.retention")

PAGE = 1000
OPEN = "open"


class SessionRetentionStore(Protocol):
    def ensure(self) -> None: ...
    def streams(
        self, aggregate_ids: Sequence[UUID]
    ) -> dict[UUID, list[tuple[int, str, bytes]]]: ...
    def remove(
        self, tombstones: Sequence[SessionTombstone]
    ) -> tuple[list[SessionTombstone], float]: ...


SessionArchiveWriter = Callable[..., None]
"""``write(path, [(tombstone, events)], release=...)``: append durably to the archive."""


@attrs.frozen
class SessionLife:
    """A session's lifecycle as the log tells it (no personal field)."""

    session_id: str
    aggregate_id: UUID
    state: str
    created_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    version: int


def session_lives(store: SessionsApplication) -> tuple[dict[UUID, SessionLife], set[str]]:
    """Every session's lifecycle, and the session ids some key's route holds as current."""
    started, reset, reopened = (
        get_topic(Session.Started),
        get_topic(Session.Reset),
        get_topic(Session.Reopened),
    )
    opened, rotated = get_topic(SessionRoute.Opened), get_topic(SessionRoute.Rotated)
    lives: dict[UUID, SessionLife] = {}
    current: dict[UUID, str] = {}
    start = 0
    while True:
        page = store.recorder.select_notifications(
            start,
            PAGE,
            topics=[started, reset, reopened, opened, rotated],
            inclusive_of_start=False,
        )
        for n in page:
            event = store.mapper.to_domain_event(n)
            uuid = event.originator_id
            if isinstance(event, SessionRoute.Opened | SessionRoute.Rotated):
                current[uuid] = event.session_id
            elif isinstance(event, Session.Started):
                lives[uuid] = SessionLife(
                    event.session_id, uuid, OPEN, event.timestamp, None, None, 1
                )
            elif isinstance(event, Session.Reset) and uuid in lives:
                lives[uuid] = attrs.evolve(
                    lives[uuid],
                    state=ENDED,
                    ended_at=event.timestamp,
                    end_reason=event.reason,
                    version=event.originator_version,
                )
            elif isinstance(event, Session.Reopened) and uuid in lives:
                lives[uuid] = attrs.evolve(
                    lives[uuid],
                    state=OPEN,
                    ended_at=None,
                    end_reason=None,
                    version=event.originator_version,
                )
        if len(page) < PAGE:
            break
        start = page[-1].id
    return lives, set(current.values())


@attrs.frozen
class SessionPruneReport:
    cutoff: datetime
    dry_run: bool
    archive: str
    deleted: bool
    candidates: int
    pruned: int
    kept_changed: int
    batches: int
    max_hold_seconds: float
    elapsed_seconds: float

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["cutoff"] = self.cutoff.isoformat()
        return data


def prune_sessions(
    store: SessionsApplication,
    retention: SessionRetentionStore,
    write_archive: SessionArchiveWriter,
    *,
    cutoff: datetime,
    now: datetime,
    archive: str,
    release: str,
    dry_run: bool = False,
    batch_size: int = 100,
) -> SessionPruneReport:
    """Prune every ended session that no key holds and that ended before ``cutoff``:
    its events appended to ``archive``, or deleted when ``archive`` is ``""`` (the
    operator's explicit choice); a tombstone stays. ``dry_run`` counts, changes nothing."""
    if cutoff > now:
        raise InvalidInput("prune: the cut-off is in the future")
    if batch_size < 1:
        raise InvalidInput("prune: the batch size must be 1 or more")
    started = time.perf_counter()
    lives, current = session_lives(store)
    chosen = sorted(
        (
            life
            for life in lives.values()
            if is_session_prunable(
                life.state,
                current=life.session_id in current,
                ended_at=life.ended_at,
                cutoff=cutoff,
            )
        ),
        key=lambda life: (life.ended_at, life.session_id),
    )
    stones = [
        SessionTombstone(
            session_id=life.session_id,
            aggregate_id=life.aggregate_id.hex,
            end_reason=life.end_reason,
            created_at=life.created_at,
            ended_at=life.ended_at or cutoff,
            events=life.version,
            pruned_at=now,
            archive=archive,
        )
        for life in chosen
    ]
    pruned, batches, holds = 0, 0, []
    if not dry_run and stones:
        retention.ensure()
        for first in range(0, len(stones), batch_size):
            batch = stones[first : first + batch_size]
            if archive:
                streams = retention.streams([UUID(t.aggregate_id) for t in batch])
                pairs = [(t, streams[UUID(t.aggregate_id)]) for t in batch]
                write_archive(archive, pairs, release=release)
            removed, held = retention.remove(batch)
            holds.append(held)
            batches += 1
            pruned += len(removed)
    report = SessionPruneReport(
        cutoff=cutoff,
        dry_run=dry_run,
        archive=archive,
        deleted=not archive,
        candidates=len(stones),
        pruned=pruned,
        kept_changed=0 if dry_run else len(stones) - pruned,
        batches=batches,
        max_hold_seconds=round(max(holds, default=0.0), 6),
        elapsed_seconds=round(time.perf_counter() - started, 3),
    )
    log.info(
        "session prune before %s: %d pruned (%s), %d kept (changed meanwhile)",
        cutoff.isoformat(),
        report.pruned,
        "deleted" if report.deleted else "archived",
        report.kept_changed,
    )
    return report
