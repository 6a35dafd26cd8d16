"""``prune``: resolved obligations older than a cut-off leave the hot store (ADR 0053).

In batches: the batch's streams are read as stored, appended to the archive (durably),
then deleted with their view rows and replaced by tombstones in one transaction of the
store (``RetentionStore.remove``), which re-checks each one and keeps any that changed.
The rule of what may go is the domain's (``domain/delivery/retention.py``): a state it
does not know is never pruned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import attrs

from gateway_ledger.domain.delivery.retention import Tombstone, is_prunable
from gateway_ledger.domain.errors import InvalidInput

log = logging.getLogger("gateway_ledger.retention")

DEFAULT_BATCH = 100
"""Obligations per prune transaction: writers wait at most one batch (a few tens of ms)."""


class RetentionStore(Protocol):
    def ensure(self) -> None: ...
    def candidates(
        self,
        cutoff: datetime,
        limit: int,
        *,
        now: datetime,
        archive: str,
        reason: str | None = None,
    ) -> list[Tombstone]: ...
    def streams(
        self, aggregate_ids: Sequence[UUID]
    ) -> dict[UUID, list[tuple[int, str, bytes]]]: ...
    def remove(self, tombstones: Sequence[Tombstone]) -> tuple[list[Tombstone], float]: ...
    def forget_tombstones(self, pruned_before: datetime) -> int: ...


ArchiveWriter = Callable[..., None]
"""``write(path, [(tombstone, events)], release=...)``: append durably to the archive."""


@attrs.frozen
class PruneReport:
    cutoff: datetime
    dry_run: bool
    archive: str
    candidates: int
    pruned: int
    kept_changed: int
    batches: int
    max_hold_seconds: float
    total_hold_seconds: float
    elapsed_seconds: float
    by_state: dict[str, int]
    tombstones_forgotten: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["cutoff"] = self.cutoff.isoformat()
        return data


def prune_resolved(
    store: RetentionStore,
    write_archive: ArchiveWriter,
    *,
    cutoff: datetime,
    now: datetime,
    archive: str,
    release: str,
    catch_up: Callable[[], Any],
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
    limit: int | None = None,
    reason: str | None = None,
    forget_tombstones_before: datetime | None = None,
) -> PruneReport:
    """Prune every resolved obligation whose last transition is before ``cutoff`` (at
    most ``limit``; only those abandoned for ``reason`` when given); ``dry_run`` counts
    them and changes nothing. ``archive`` '' writes no archive: only the tombstones (the
    audit facts) stay, as for dead letters past their retention. Tombstones of
    obligations pruned before ``forget_tombstones_before`` are deleted too (their ids may
    then be recorded again as new)."""
    if cutoff > now:
        raise InvalidInput("prune: the cut-off is in the future")
    if batch_size < 1:
        raise InvalidInput("prune: the batch size must be 1 or more")
    started = time.perf_counter()
    catch_up()
    if not dry_run:
        store.ensure()
    kept: set[str] = set()  # changed meanwhile: left in the store, not asked for again
    candidates, pruned, batches, holds = 0, 0, 0, []
    by_state: dict[str, int] = {}
    budget = limit if limit is not None else 1 << 40
    while budget > 0:
        want = budget if dry_run else min(batch_size, budget)
        found = store.candidates(cutoff, want + len(kept), now=now, archive=archive, reason=reason)
        batch = [
            t
            for t in found
            if t.aggregate_id not in kept
            and is_prunable(t.state, quarantined=False, resolved_at=t.resolved_at, cutoff=cutoff)
        ][:want]
        if not batch:
            break
        candidates += len(batch)
        if dry_run:
            for t in batch:
                by_state[t.state] = by_state.get(t.state, 0) + 1
            break
        if archive:
            streams = store.streams([UUID(t.aggregate_id) for t in batch])
            pairs = [(t, streams[UUID(t.aggregate_id)]) for t in batch]
            write_archive(archive, pairs, release=release)
        removed, held = store.remove(batch)
        holds.append(held)
        batches += 1
        pruned += len(removed)
        gone = {t.aggregate_id for t in removed}
        kept.update(t.aggregate_id for t in batch if t.aggregate_id not in gone)
        for t in removed:
            by_state[t.state] = by_state.get(t.state, 0) + 1
        budget -= len(batch)
        if len(removed) < len(batch):
            catch_up()  # a view behind, or a stream that moved: let the views see it
    forgotten = 0
    if forget_tombstones_before is not None and not dry_run:
        forgotten = store.forget_tombstones(forget_tombstones_before)
    report = PruneReport(
        cutoff=cutoff,
        dry_run=dry_run,
        archive=archive,
        candidates=candidates,
        pruned=pruned,
        kept_changed=len(kept),
        batches=batches,
        max_hold_seconds=round(max(holds, default=0.0), 6),
        total_hold_seconds=round(sum(holds), 6),
        elapsed_seconds=round(time.perf_counter() - started, 3),
        by_state=by_state,
        tombstones_forgotten=forgotten,
    )
    log.info(
        "prune before %s: %d pruned (%s), %d kept (changed meanwhile), %d batches, "
        "writers held at most %.4f s",
        cutoff.isoformat(),
        report.pruned,
        by_state,
        len(kept),
        batches,
        report.max_hold_seconds,
    )
    return report
