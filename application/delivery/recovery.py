"""The recovery sweep: take over the replies whose owner died before they were confirmed.

The view (:mod:`gateway_ledger.projections.delivery.recoverable`) only names candidates. For each
one, in the upstream order, the sweep skips live owners without touching the aggregate,
then reloads the aggregate and lets *it* decide: abandon (too many recovery claims, or
stale), leave it (platform offline: nothing spent), or claim it. The claim is appended at
the aggregate's next version; when two sweepers race, the event store's unique
(aggregate, version) key lets exactly one win and the other gets ``IntegrityError``,
which here means "someone else has it": skipped quietly and counted. No other lock.

Nothing whose personal fields cannot be opened is handed to a sender (ADR 0027): each
candidate is read on its own, an erased one is abandoned (``erased``), one whose sealed
fields fail authentication, or with an event that does not decode, is quarantined (a
``Quarantined`` fact when it can still be loaded sealed) and counted, never claimed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any
from uuid import UUID

import attrs
from eventsourcing.persistence import IntegrityError, PersistenceError, Recording

from gateway_ledger.application.delivery.interface import Claim
from gateway_ledger.application.delivery.ledger_ports import LedgerPort, LivenessPolicy, Loaded
from gateway_ledger.application.observability import tracing
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import LedgerError, NotFound
from gateway_ledger.domain.values import (
    AbandonReason,
    OwnerIdentity,
    QuarantineReason,
    require_aware,
)
from gateway_ledger.projections.delivery.recoverable import RecoverableEntry

log = logging.getLogger("gateway_ledger.recovery")


@attrs.frozen
class SweepResult:
    """What one sweep did, in counts (ids go to the log, bodies nowhere)."""

    claimed: int = 0
    lost_races: int = 0
    abandoned: dict[str, int] = attrs.field(factory=dict)
    skipped_offline: int = 0
    skipped_alive: int = 0
    skipped_own: int = 0
    resolved_meanwhile: int = 0
    errors: int = 0
    quarantined: int = 0
    """Owed obligations left alone because they cannot be read (ADR 0027): already
    quarantined, or quarantined by this sweep. Recovery is partial while it is not 0."""
    candidates: int = 0
    view_events_applied: int = 0
    elapsed_ms: float = 0.0

    @property
    def abandoned_total(self) -> int:
        return sum(self.abandoned.values())


@attrs.frozen
class Unsendable:
    """Why a loaded obligation must not be handed to a sender (ADR 0027)."""

    abandon: AbandonReason | None = None
    """``erased``: its session was forgotten; abandon it."""
    quarantine: QuarantineReason | None = None
    found_at: int = 0
    """The version of the first event that could not be read (quarantine only)."""


def unsendable(loaded: Loaded, aggregate_id: UUID) -> Unsendable | None:
    """The one rule: what was read without every personal field opened is never sent."""
    bad = loaded.undecodable.get(aggregate_id)
    if bad is not None:
        return Unsendable(quarantine=bad.reason, found_at=bad.originator_version)
    version = loaded.openings.unreadable.get(aggregate_id)
    if version is not None:
        return Unsendable(quarantine=QuarantineReason.UNREADABLE, found_at=version)
    if aggregate_id in loaded.openings.erased:
        return Unsendable(abandon=AbandonReason.ERASED)
    return None


def load_sealed(ledger: LedgerPort, aggregate_id: UUID) -> DeliveryObligation | None:
    """The obligation rebuilt without opening its sealed fields (to quarantine or abandon
    it: neither reads them), or None when even that fails."""
    with ledger.private_mapper.sealed():
        loaded = ledger.load_each([aggregate_id])
    found = loaded.aggregates.get(aggregate_id)
    return found if isinstance(found, DeliveryObligation) else None


@attrs.frozen
class SweepDecision:
    """An aggregate the sweep changed in memory (claimed, abandoned or quarantined), not
    yet saved."""

    obligation: DeliveryObligation
    seen_owner: OwnerIdentity
    needs_marker: bool
    abandon_reason: AbandonReason | None = None
    quarantine_reason: QuarantineReason | None = None


_MISSING: Any = object()

MAX_BATCH = 64
"""Decisions saved together in one transaction: the commit is the dominant cost."""


class RecoverySweep:
    """One sweep by one ledger; build it per call (it caches liveness answers).

    Decisions are saved in batches, one transaction each (all or nothing). A batch that
    hits ``IntegrityError`` (someone else appended to one of its aggregates) is redone
    one obligation at a time, each reloaded and judged again, and the batch size halves,
    so a contended sweep degrades to single claims and an uncontended one commits rarely.
    """

    def __init__(
        self,
        ledger: LedgerPort,
        now: datetime,
        deliverable_platforms: Collection[str] | None,
        liveness: LivenessPolicy,
        batch_size: int = MAX_BATCH,
        records_send: bool = False,
    ) -> None:
        self.ledger = ledger
        self.records_send = records_send
        self.now = now
        self.platforms = None if deliverable_platforms is None else set(deliverable_platforms)
        self.liveness = liveness
        self.me = ledger.owner
        self.counts: Counter[str] = Counter()  # SweepResult's counters, by field name
        self.abandoned: Counter[str] = Counter()  # by reason
        self.batch_size = max(1, batch_size)
        self.won: list[Claim] = []
        self.written: list[Recording[UUID]] = []
        """What this sweep stored, each event with its notification, for the view."""
        self._alive: dict[OwnerIdentity, bool] = {}
        self._gone: dict[OwnerIdentity, bool] = {}

    def is_alive(self, owner: OwnerIdentity) -> bool:
        alive = self._alive.get(owner)
        if alive is None:
            alive = self._alive[owner] = bool(self.liveness(owner))
        return alive

    def proven_gone(self, owner: OwnerIdentity) -> bool:
        """The ledger's proof that the owner is gone, asked once per owner and run (a
        process proven gone stays gone; the orphans of one dead gateway share it)."""
        gone = self._gone.get(owner)
        if gone is None:
            gone = self._gone[owner] = bool(self.ledger.gone_proof(owner))
        return gone

    def run(self) -> tuple[SweepResult, list[Claim]]:
        """The view caught up over the orphans' events, then their aggregates loaded: the
        load takes the events the view read and its parse of them (``sharing_parses``,
        the rows' versions) and opens what the view left sealed, so each event is read
        and parsed once; the claims are fenced by the version (ADR 0080)."""
        with self.ledger.private_mapper.sharing_parses():
            return self._run()

    def _run(self) -> tuple[SweepResult, list[Claim]]:
        started = time.perf_counter()
        view = self.ledger.recoverable
        applied = view.catch_up()
        entries = view.entries()
        orphaned = []
        for entry in entries:
            if entry.is_quarantined:
                self.counts["quarantined"] += 1
                log.error("sweep: obligation %s is quarantined: not claimed", entry.obligation_id)
            elif entry.owner == self.me:
                self.counts["skipped_own"] += 1
            elif self.is_alive(entry.owner):
                self.counts["skipped_alive"] += 1
            else:
                orphaned.append(entry)
        position = 0
        while position < len(orphaned):
            chunk = orphaned[position : position + self.batch_size]
            position += len(chunk)
            ids = [UUID(entry.aggregate_id) for entry in chunk]  # parsed once per sweep
            loaded = self.guarded(self.load, "(batch)", chunk, ids)
            batch = []
            for entry, aggregate_id in zip(chunk, ids, strict=True):
                # If the batched read failed, each one is read on its own instead.
                decision = self.guarded(
                    self.decide, entry.obligation_id, entry.owner, aggregate_id, loaded
                )
                if decision is not None:
                    batch.append(decision)
            self.commit(batch)
        if self.won or self.abandoned:
            try:
                applied += view.follow(self.written)  # our own claims; repairable if it fails
            except PersistenceError as e:
                log.warning("sweep: view catch-up after claims failed (repaired later): %s", e)
        result = SweepResult(
            **self.counts,
            abandoned=dict(self.abandoned),
            candidates=len(entries),
            view_events_applied=applied,
            elapsed_ms=(time.perf_counter() - started) * 1000,
        )
        return result, self.won

    def load(self, _: str, chunk: list[RecoverableEntry], ids: list[UUID]) -> Loaded:
        """The chunk's aggregates (``ids``, in its order), each on its own: from the events
        the view has just read when it read all of one's, else read in one query."""
        viewed = {i: e.version for i, e in zip(ids, chunk, strict=True)}
        return self.ledger.load_each(ids, viewed)

    def guarded(self, step: Callable[..., Any], obligation_id: str, *args: Any) -> Any:
        """One obligation's trouble is logged and counted; what was won is still returned."""
        try:
            return step(obligation_id, *args)
        except (PersistenceError, LedgerError) as e:
            self.counts["errors"] += 1
            log.warning("sweep: obligation %s skipped: %s", obligation_id, e)
            return None

    def decide(
        self,
        obligation_id: str,
        seen_owner: OwnerIdentity,
        aggregate_id: UUID,
        loaded: Loaded | None = None,
    ) -> SweepDecision | None:
        """Let the (re)loaded aggregate decide; the view row may be out of date."""
        counts = self.counts
        if loaded is None:
            loaded = self.ledger.load_each([aggregate_id])
        problem = unsendable(loaded, aggregate_id)
        obligation: Any = loaded.aggregates.get(aggregate_id, _MISSING)
        if problem is not None and problem.quarantine is not None:
            obligation = load_sealed(self.ledger, aggregate_id)
            if obligation is None:
                # Not even its clear fields rebuild it: the views quarantine it by themselves.
                counts["quarantined"] += 1
                log.error(
                    "sweep: obligation %s quarantined (%s at v%d): not claimed",
                    obligation_id,
                    problem.quarantine.value,
                    problem.found_at,
                )
                return None
        if obligation is _MISSING or obligation.is_resolved:
            counts["resolved_meanwhile"] += 1
            return None
        if obligation.owner != seen_owner:
            if obligation.owner == self.me:
                counts["skipped_own"] += 1
                return None
            if self.is_alive(obligation.owner):
                counts["lost_races"] += 1  # another sweeper claimed it since the view was read
                return None
        if obligation.is_quarantined:
            counts["quarantined"] += 1
            return None
        owner_before = obligation.owner
        needs_marker = obligation.needs_marker
        if problem is not None and problem.quarantine is not None:
            obligation.quarantine(
                reason=problem.quarantine, found_at=problem.found_at, by=self.me, now=self.now
            )
            return SweepDecision(obligation, owner_before, needs_marker, None, problem.quarantine)
        policy = self.ledger.policy
        reason = None
        detail = f"recovery sweep: {obligation.recovery_attempts} recovery claims"
        if problem is not None and problem.abandon is not None:
            reason, detail = problem.abandon, ""  # nothing sealed under an erased subject
        elif obligation.recovery_spent(policy):
            reason = AbandonReason.MAX_ATTEMPTS
        elif policy.is_stale(obligation.recorded_at, self.now):
            reason = AbandonReason.STALE
        elif self.platforms is not None and obligation.platform not in self.platforms:
            counts["skipped_offline"] += 1
            return None
        if reason is None:
            obligation.claim(
                by=self.me,
                now=self.now,
                policy=policy,
                previous_owner_gone=self.proven_gone(owner_before),
                records_send=self.records_send,
            )
        else:
            obligation.abandon(reason=reason, now=self.now, by=self.me, detail=detail)
        return SweepDecision(obligation, owner_before, needs_marker, reason)

    def commit(self, batch: list[SweepDecision]) -> None:
        if not batch:
            return
        try:
            self.written += self.ledger.store_changes([d.obligation for d in batch])
        except (IntegrityError, PersistenceError) as e:
            if len(batch) == 1 and isinstance(e, IntegrityError):
                self.counts["lost_races"] += 1
                log.debug(
                    "sweep: %s taken by a concurrent sweeper", batch[0].obligation.obligation_id
                )
                return
            self.batch_size = max(1, self.batch_size // 2)
            log.debug("sweep: batch of %d refused (%s); redoing one by one", len(batch), e)
            for d in batch:
                self.guarded(self.redo, d.obligation.obligation_id, d.seen_owner, d.obligation.id)
            return
        for d in batch:
            self.done(d)

    def redo(self, obligation_id: str, seen_owner: OwnerIdentity, aggregate_id: UUID) -> None:
        decision = self.decide(obligation_id, seen_owner, aggregate_id)
        if decision is None:
            return
        try:
            self.written += self.ledger.store_changes([decision.obligation])
        except IntegrityError:
            self.counts["lost_races"] += 1
            log.debug("sweep: %s taken by a concurrent sweeper", obligation_id)
            return
        self.done(decision)

    def done(self, d: SweepDecision) -> None:
        obligation = d.obligation
        if d.quarantine_reason is not None:
            self.counts["quarantined"] += 1
            log.error(
                "sweep: obligation %s quarantined (%s): never sent",
                obligation.obligation_id,
                d.quarantine_reason.value,
            )
            return
        if d.abandon_reason is not None:
            reason = d.abandon_reason.value
            self.abandoned[reason] += 1
            log.info("sweep: abandoned %s (%s)", obligation.obligation_id, reason)
            return
        self.counts["claimed"] += 1
        tracing.mark("claim", obligation, recovery_attempt=obligation.recovery_attempts)
        log.debug(
            "sweep: claimed %s attempt=%d needs_marker=%s",
            obligation.obligation_id,
            obligation.recovery_attempts,
            d.needs_marker,
        )
        self.won.append(Claim(obligation, d.needs_marker))


def sweep_recoverable(
    ledger: LedgerPort,
    now: datetime | None = None,
    *,
    deliverable_platforms: Collection[str] | None = None,
    liveness: LivenessPolicy | None = None,
    records_send: bool = False,
) -> tuple[SweepResult, list[Claim]]:
    """Run one sweep; returns its counters and the obligations this call won.
    ``records_send``: the caller records each claimed reply's send start before it
    sends (``start_recovery_send``), so a claim it never sent spends nothing (ADR 0070)."""
    moment = require_aware("now", now if now is not None else ledger.clock())
    sweep = RecoverySweep(
        ledger,
        moment,
        deliverable_platforms,
        liveness or ledger.liveness,
        records_send=records_send,
    )
    result, won = sweep.run()
    log.info(
        "sweep: %d candidates, claimed %d, lost races %d, abandoned %s, skipped offline %d, "
        "alive %d, own %d, resolved meanwhile %d, errors %d, quarantined %d, view +%d events, "
        "%.1f ms",
        result.candidates,
        result.claimed,
        result.lost_races,
        result.abandoned or "{}",
        result.skipped_offline,
        result.skipped_alive,
        result.skipped_own,
        result.resolved_meanwhile,
        result.errors,
        result.quarantined,
        result.view_events_applied,
        result.elapsed_ms,
    )
    return result, won


def load_for_sending(
    ledger: LedgerPort, obligation_id: str
) -> tuple[DeliveryObligation | None, Unsendable | None]:
    """One obligation as a sender may use it: (the aggregate, None), or (None, why not).

    What cannot be sent is settled here, as a sweep would: an erased one is abandoned
    (``erased``), an unreadable one quarantined; a lost race leaves it to its history.
    """
    aggregate_id = ledger.aggregate_id(obligation_id)
    loaded = ledger.load_each([aggregate_id])
    problem = unsendable(loaded, aggregate_id)
    if problem is None:
        found = loaded.aggregates.get(aggregate_id)
        if not isinstance(found, DeliveryObligation):
            raise NotFound("obligation", obligation_id)
        return found, None
    obligation = load_sealed(ledger, aggregate_id)
    log.error(
        "obligation %s not sent: %s",
        obligation_id,
        problem.abandon.value if problem.abandon else f"quarantined ({problem.quarantine})",
    )
    if obligation is None or obligation.is_resolved or obligation.is_quarantined:
        return None, problem
    if problem.abandon is not None:
        obligation.abandon(reason=problem.abandon, now=ledger.clock(), by=ledger.owner)
    else:
        assert problem.quarantine is not None
        obligation.quarantine(
            reason=problem.quarantine,
            found_at=problem.found_at,
            by=ledger.owner,
            now=ledger.clock(),
        )
    try:
        ledger.save(obligation)
    except IntegrityError:
        log.info("obligation %s changed meanwhile; its history decides", obligation_id)
    return None, problem
