"""DeliveryLedger: the use cases of the delivery half, on an event store.

Method names follow the upstream module (record_obligation, mark_attempting, ...) so an
existing gateway can switch with few edits. Every transition is an event appended at the
aggregate's next version; a writer that lost the race gets ConcurrentUpdate.

This class is the application: it knows no store, lease or file. What it needs from them
(the sealing mapper, the bulk loader, liveness, the lease) it declares as ports
(``ledger_ports.py``); ``gateway_ledger/bootstrap.py`` subclasses it with the
infrastructure that satisfies them, and that subclass is the public ``DeliveryLedger``.
"""

from __future__ import annotations

import functools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, overload
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import IntegrityError, Recording

from gateway_ledger.application.clock import Clock, system_clock
from gateway_ledger.application.delivery import interface
from gateway_ledger.application.delivery.audit import DuplicateAudit, audit_duplicates
from gateway_ledger.application.delivery.interface import claimed_item, media_items
from gateway_ledger.application.delivery.ledger_ports import (
    EventAppender,
    GoneProof,
    LeaseHolder,
    LivenessPolicy,
    Loaded,
)
from gateway_ledger.application.delivery.measures import Measures
from gateway_ledger.application.delivery.operations import (
    LedgerStats,
    Timeline,
    compute_stats,
    list_obligations,
    request_retry,
    timeline,
)
from gateway_ledger.application.delivery.recovery import SweepResult, sweep_recoverable
from gateway_ledger.application.delivery.views import HistoryEntry, ObligationStatus
from gateway_ledger.application.observability import causes, tracing
from gateway_ledger.application.privacy.erasure import (
    DELIVERY_PRIVACY,
    ErasureReport,
    forget_in_ledger,
    is_erased,
)
from gateway_ledger.application.privacy.policy import PrivacyPolicy
from gateway_ledger.application.privacy.ports import (
    ErasableSessions,
    KeptAggregates,
    SealingMapper,
)
from gateway_ledger.domain.delivery.obligation import (
    DeliveryObligation,
    obligation_uuid,
    record_differences,
    require_obligation_id,
)
from gateway_ledger.domain.errors import (
    ConcurrentUpdate,
    ConflictingRecord,
    InvalidInput,
    LedgerError,
    NotFound,
)
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    OwnerIdentity,
    SendGuard,
)
from gateway_ledger.projections.delivery.obligation_index import IndexEntry, ObligationIndexView
from gateway_ledger.projections.delivery.recoverable import RecoverableView

log = logging.getLogger("gateway_ledger.ledger")

LEDGER_APPLICATION_NAME = "gateway_ledger"
"""Part of the stored identity of every event; never change it on an existing store."""

VALUE_OBJECTS: tuple[type, ...] = (OwnerIdentity, DeliveryTarget, MediaItem)
"""The value objects the ledger's events carry: its transcoder must know each of them."""


@functools.lru_cache(maxsize=4096)
def _checked_uuid(obligation_id: str) -> UUID:
    """A validated id's aggregate id; each call of a lifecycle names the same id again."""
    return obligation_uuid(require_obligation_id(obligation_id))


class DeliveryLedger(Application[UUID], ABC):
    """Every final reply the gateway owes, as an event-sourced DeliveryObligation.

    Personal fields are sealed at rest by the store's mapper (ADR 0012) as
    ``privacy_policy`` declares. Built with an ``owner`` (who appends), a ``policy`` (the
    sweep's limits) and a ``clock``; the ports below are supplied by the store-backed
    subclass in ``bootstrap.py``.
    """

    name = LEDGER_APPLICATION_NAME
    privacy_policy: ClassVar[PrivacyPolicy] = DELIVERY_PRIVACY

    heartbeat: LeaseHolder | None = None
    """This owner's lease while the ledger is started (None: no lease, liveness by /proc)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        owner: OwnerIdentity,
        policy: LedgerPolicy | None = None,
        clock: Clock = system_clock,
    ) -> None:
        super().__init__(env=env)
        self.owner = owner
        self.policy = policy or LedgerPolicy()
        self.clock = clock
        self.last_sweep: SweepResult | None = None
        self.measures = Measures()
        """This process's sweep durations and retry waits (``LedgerCollector`` reads them)."""
        self._recoverable: RecoverableView | None = None
        self._obligation_index: ObligationIndexView | None = None

    # -- ports (supplied by the store-backed subclass) ---------------------------------------

    @property
    @abstractmethod
    def private_mapper(self) -> SealingMapper:
        """The mapper that seals personal fields (its keyring names subjects)."""

    @property
    @abstractmethod
    def liveness(self) -> LivenessPolicy:
        """Leases where this ledger uses them (PostgreSQL by default), else /proc (ADR 0010)."""

    @property
    @abstractmethod
    def gone_proof(self) -> GoneProof:
        """Proof that an owner's process is gone (this host only), for a claim (ADR 0050)."""

    @abstractmethod
    def load_each(
        self, aggregate_ids: Sequence[UUID], viewed: Mapping[UUID, int] | None = None
    ) -> Loaded:
        """The current state of each aggregate, read together, each failing on its own;
        ``viewed``: versions a view shows of them, whose events this process may have
        just read for it (then taken from that read, fenced by their version, ADR 0080)."""

    @property
    @abstractmethod
    def kept(self) -> KeptAggregates:
        """Obligations kept decrypted between this process's writes (forgotten with their key)."""

    @property
    @abstractmethod
    def sealed_events(self) -> EventAppender:
        """The application's event store, through which every write goes."""

    @abstractmethod
    def construct_recoverable_view(self) -> RecoverableView:
        """The index of unresolved obligations the sweep reads (built once, lazily)."""

    @abstractmethod
    def construct_obligation_index(self) -> ObligationIndexView:
        """One row per obligation, for status, list and metrics (built once, lazily)."""

    def was_pruned(self, obligation_id: str) -> bool:
        """True when the obligation was resolved and pruned (its tombstone stays; issue
        19). A store that prunes says so (the store-backed subclass)."""
        return False

    @abstractmethod
    def start(self) -> DeliveryLedger:
        """Begin what runs while the ledger is open (its lease, where leases are used);
        idempotent. A constructor starts nothing."""

    # -- writes -------------------------------------------------------------------------------

    def record_obligation(
        self,
        *,
        obligation_id: str,
        session_key: str,
        platform: str,
        chat_id: str,
        thread_id: str | None = None,
        content: str,
        reply_to: str | None = None,
        media: Iterable[MediaItem | Mapping[str, Any]] = (),
        metadata: Mapping[str, Any] | None = None,
        parts: Sequence[str] = (),
    ) -> str:
        """Record a final reply as owed. Recording an existing id changes nothing."""
        obligation = self.new_obligation(
            obligation_id=obligation_id,
            session_key=session_key,
            platform=platform,
            chat_id=chat_id,
            thread_id=thread_id,
            content=content,
            reply_to=reply_to,
            media=media,
            metadata=metadata,
            parts=parts,
        )
        try:
            self._store(obligation)
        except IntegrityError:
            # The id exists (recorded earlier, or by a concurrent writer): the same record
            # again is idempotent, another one under that id is refused.
            if obligation_uuid(obligation_id) not in self.repository:
                if self.was_pruned(obligation_id):  # resolved and pruned: still recorded
                    log.debug("obligation %s was pruned; nothing appended", obligation_id)
                    return obligation_id
                raise
            self.check_same_record(obligation)
            log.debug("obligation %s already recorded; nothing appended", obligation_id)
            return obligation_id
        self.kept.keep(obligation)
        log.debug("obligation %s recorded platform=%s", obligation_id, platform)
        return obligation_id

    def new_obligation(
        self,
        *,
        obligation_id: str,
        session_key: str,
        platform: str,
        chat_id: str,
        thread_id: str | None = None,
        content: str,
        reply_to: str | None = None,
        media: Iterable[MediaItem | Mapping[str, Any]] = (),
        metadata: Mapping[str, Any] | None = None,
        parts: Sequence[str] = (),
    ) -> DeliveryObligation:
        """Build (not save) a Recorded obligation owned by this process; validates all input."""
        try:
            target = DeliveryTarget(
                platform=platform, chat_id=chat_id, thread_id=thread_id, reply_to=reply_to
            )
            items = media_items(media)
        except TypeError as e:
            raise InvalidInput(str(e)) from None
        return DeliveryObligation.record(
            obligation_id=obligation_id,
            session_key=session_key,
            target=target,
            content=content,
            owner=self.owner,
            now=self.clock(),
            parts=parts,
            media=items,
            metadata=metadata,
        )

    def check_same_record(self, obligation: DeliveryObligation) -> None:
        """Raise ConflictingRecord when this id's stored record differs from ``obligation``.

        Reads (and opens) only the stored ``Recorded`` event. When its personal fields can
        no longer be opened (the session was forgotten), nothing can be compared and the
        first record stands, as before erasure.
        """
        uuid = obligation_uuid(obligation.obligation_id)
        recorded = list(self.events.get(uuid, lte=1))
        if not recorded and self.was_pruned(obligation.obligation_id):
            return  # resolved and pruned: nothing left to compare, the first record stands
        if not recorded:
            raise NotFound("obligation", obligation.obligation_id)
        differences = record_differences(recorded[0], obligation)
        if differences and not is_erased(self, uuid):
            log.warning(
                "obligation %s recorded again with another %s: refused",
                obligation.obligation_id,
                ", ".join(differences),
            )
            raise ConflictingRecord(obligation.obligation_id, differences)

    def check_writable(self) -> None:
        """Raise unless this process can record: the master key opens the store's data keys
        (``MasterKeyMismatch`` otherwise) and the store takes a write (rolled back).

        Opening a store and reading it show neither: a gateway calls this at start, so a
        wrong key or a read-only store is said once, loudly, not found reply by reply.
        """
        self.private_mapper.keyring.table.probe_write()

    def mark_attempting(self, obligation_id: str, *, guard: SendGuard | str | None = None) -> None:
        """A send starts. ``guard``: what it does against an unannounced duplicate
        (``none``, ``marker`` or ``idempotency_key``), for the audit (ADR 0026); the
        upstream call without it records nothing, and the audit assumes the rule."""
        self.change(
            obligation_id,
            "attempting",
            lambda obligation: obligation.start_attempt(
                by=self.owner, now=self.clock(), guard=guard
            ),
        )

    def mark_delivered(
        self,
        obligation_id: str,
        receipt: Sequence[str | int] | str | int | None = None,
        *,
        fence: int | None = None,
    ) -> None:
        """``fence``: the one held when the send started; a stale one records a late result."""
        ids = interface.receipt_ids(receipt)
        self.change(
            obligation_id,
            "delivered",
            lambda obligation: obligation.confirm_delivery(
                by=self.owner, now=self.clock(), receipt=ids, fence=fence
            ),
        )

    def mark_failed(
        self,
        obligation_id: str,
        error: str = "",
        classification: ErrorClass | str = ErrorClass.AMBIGUOUS,
        retry_after: float | None = None,
        *,
        fence: int | None = None,
    ) -> None:
        error_class = interface.error_class(classification)
        self.change(
            obligation_id,
            "failed",
            lambda obligation: obligation.fail(
                by=self.owner,
                now=self.clock(),
                error=error,
                classification=error_class,
                retry_after=retry_after,
                fence=fence,
            ),
        )

    def report_status(
        self,
        obligation_id: str,
        status: str,
        at: datetime | None = None,
        detail: str = "",
        message_id: str | None = None,
    ) -> bool:
        """Record a status the platform reported after it accepted the delivered send
        (``delivered_to_device``, ``read``, ``failed_after_acceptance``; ADR 0050), at
        the platform's time ``at`` (default: now). Statuses only move forward: a late or
        repeated one changes nothing and returns False. ``failed_after_acceptance``
        reopens the obligation: a sweep re-sends it under the usual rules."""
        return self.record_status(obligation_id, status, at, detail, message_id)[0]

    def record_status(
        self,
        obligation_id: str,
        status: str,
        at: datetime | None = None,
        detail: str = "",
        message_id: str | None = None,
    ) -> tuple[bool, DeliveryObligation]:
        """``report_status``, also returning the obligation as stored after it. Decided
        on the stored state, never on a kept copy: a status that changes nothing on a copy
        that is behind would not say so by a refusal."""
        obligation = self.load(obligation_id)
        recorded = obligation.report_status(
            status=status,
            at=self.clock() if at is None else at,
            now=self.clock(),
            detail=detail,
            by=self.owner,
            message_id=message_id,
        )
        if recorded:
            self.save_transition(obligation, f"status {status}")
        return recorded, obligation

    def abandon(
        self,
        obligation_id: str,
        reason: AbandonReason | str = AbandonReason.OPERATOR,
        detail: str = "",
    ) -> None:
        abandon_reason = interface.abandon_reason(reason)
        self.change(
            obligation_id,
            f"abandoned ({abandon_reason.value})",
            lambda obligation: obligation.abandon(
                reason=abandon_reason, now=self.clock(), by=self.owner, detail=detail
            ),
        )

    # -- recovery (application/delivery/recovery.py, ADR 0007) --------------------------------

    @property
    def recoverable(self) -> RecoverableView:
        """The index of unresolved obligations; resumes from its tracked position."""
        if self._recoverable is None:
            self._recoverable = self.construct_recoverable_view()
        return self._recoverable

    def sweep_recoverable(
        self,
        now: datetime | None = None,
        *,
        deliverable_platforms: Collection[str] | None = None,
        liveness: LivenessPolicy | None = None,
        records_send: bool = False,
    ) -> list[dict[str, Any]]:
        """Claim what dead owners left unresolved; returns only what this call won.

        Counters of the sweep are in ``last_sweep``. ``deliverable_platforms=None`` means
        every platform is connected; ``liveness`` replaces the local /proc judgement.
        ``records_send``: the caller records each claimed reply's send start before it
        sends (``start_recovery_send``, as the gateway does), so a claim whose send never
        started spends no recovery attempt (ADR 0070); upstream's callers send at once.
        """
        run_id = causes.new_id()
        started = time.perf_counter()
        with (
            tracing.span("sweep", run_id=run_id) as opened,
            causes.caused_by(f"sweep:{run_id}", correlation_id=run_id),
        ):
            self.last_sweep, won = sweep_recoverable(
                self,
                now,
                deliverable_platforms=deliverable_platforms,
                liveness=liveness or self.liveness,
                records_send=records_send,
            )
            tracing.annotate(opened, claimed=len(won), abandoned=self.last_sweep.abandoned_total)
        self.measures.sweeps.observe(time.perf_counter() - started)
        return [claimed_item(claim) for claim in won]

    def others_unresolved(
        self, platforms: Collection[str]
    ) -> list[tuple[str, DeliveryTarget, datetime]]:
        """The replies other owners still owe on these platforms (id, target, recorded
        at), for per-chat order (ADR 0065): found in the recoverable view (caught up
        first), each read from its events, since the view holds no target."""
        view = self.recoverable
        view.catch_up()
        entries = [
            e
            for e in view.entries()
            if e.owner != self.owner and not e.is_quarantined and e.platform in platforms
        ]
        loaded = self.load_each([UUID(e.aggregate_id) for e in entries])
        found = []
        for obligation in loaded.aggregates.values():
            if isinstance(obligation, DeliveryObligation) and not obligation.is_resolved:
                found.append((obligation.obligation_id, obligation.target, obligation.recorded_at))
        return found

    def unresolved_among(self, obligation_ids: Sequence[str]) -> set[str]:
        """Which of these obligations are still owed, read from their events (one that
        cannot be read is never sent, so it owes nothing to anyone's order). Asked every
        ``poll`` while another gateway's reply holds a queue: only states are read, so
        the events are rebuilt with their sealed fields left sealed (no key, no text)."""
        by_id = {self._uuid(o): o for o in obligation_ids}
        with self.private_mapper.sealed():
            loaded = self.load_each(list(by_id))
        return {
            by_id[aid]
            for aid, obligation in loaded.aggregates.items()
            if isinstance(obligation, DeliveryObligation) and not obligation.is_resolved
        }

    def forget_session(
        self, session_key: str, *, requested_by: str = "", sessions: ErasableSessions | None = None
    ) -> ErasureReport:
        """Erase the session's personal data; its history stays, showing ``[erased]``.

        Pass the open ``SessionStore`` as ``sessions`` to erase its conversations too.
        """
        return forget_in_ledger(self, session_key, requested_by=requested_by, sessions=sessions)

    def is_erased(self, obligation_id: str) -> bool:
        """True when the obligation's session was forgotten: never send it, abandon it."""
        return is_erased(self, self._uuid(obligation_id))

    def forgotten_since(self, session_key: str, made_at: datetime) -> bool:
        """True when the session was forgotten after ``made_at``: a reply made then
        belongs to the forgotten conversation, and its sealed record is refused
        (ADR 0071), so a reply whose record is still on its way is not sent (ADR 0073).
        False where nothing is sealed. One key-table read."""
        mapper = self.private_mapper
        if not mapper.encrypt:
            return False
        keys = mapper.keyring
        return keys.forgotten_after(keys.subject_id(session_key), made_at)

    # -- reads --------------------------------------------------------------------------------

    def get(self, obligation_id: str) -> ObligationStatus:
        return ObligationStatus.of(self.load(obligation_id))

    @overload
    def history(self, obligation_id: str) -> list[HistoryEntry]: ...
    @overload
    def history(self, obligation_id: str, at: datetime) -> Timeline: ...
    def history(self, obligation_id: str, at: datetime | None = None) -> Any:
        """Every event of the obligation; with ``at``, a Timeline of its state at that moment."""
        if at is not None:
            return timeline(self, obligation_id, at)
        events = list(self.events.get(self._uuid(obligation_id)))
        if not events:
            raise NotFound("obligation", obligation_id)
        return [HistoryEntry.of(e) for e in events]

    def exists(self, obligation_id: str) -> bool:
        return self._uuid(obligation_id) in self.repository

    # -- operators (application/delivery/operations.py and audit.py, ADR 0011) ---------------

    @property
    def obligation_index(self) -> ObligationIndexView:
        """One row per obligation, for status, list and metrics; resumes from its position."""
        if self._obligation_index is None:
            self._obligation_index = self.construct_obligation_index()
        return self._obligation_index

    def stats(self, now: datetime | None = None) -> LedgerStats:
        """The figures of ``gateway-ledger status`` and ``metrics``, read from the index."""
        return compute_stats(self, now)

    def timeline(self, obligation_id: str, at: datetime | None = None) -> Timeline:
        return timeline(self, obligation_id, at)

    def retry(self, obligation_id: str, by_operator: str = "") -> ObligationStatus:
        """An operator's retry: claimable by the next sweep at once; refused when final."""
        return request_retry(self, obligation_id, by_operator)

    def audit_duplicates(self) -> DuplicateAudit:
        """Replay every event; report possible duplicates and ownership problems."""
        return audit_duplicates(self)

    def list(
        self,
        *,
        state: str | None = None,
        platform: str | None = None,
        since: datetime | None = None,
        session: str | None = None,
        limit: int | None = None,
        status: str | None = None,
    ) -> tuple[IndexEntry, ...]:
        """Obligations from the index, oldest first (``session`` is a session key;
        ``status``: the last status their platform reported, e.g. ``read``)."""
        return list_obligations(
            self,
            state=state,
            platform=platform,
            since=since,
            session=session,
            limit=limit,
            status=status,
        )

    # -- helpers ------------------------------------------------------------------------------

    def aggregate_id(self, obligation_id: str) -> UUID:
        """The aggregate id of an obligation id (validated)."""
        return self._uuid(obligation_id)

    @staticmethod
    def _uuid(obligation_id: str) -> UUID:
        """Every lookup takes an id as a record does: refused (InvalidInput) the same way."""
        if not isinstance(obligation_id, str) or not obligation_id:
            raise InvalidInput("obligation_id must be a non-empty str")
        return _checked_uuid(obligation_id)

    # -- the write path of the synchronous API ---------------------------------------------

    def load(self, obligation_id: str) -> DeliveryObligation:
        """The obligation as stored now (``NotFound`` if it was never recorded)."""
        try:
            aggregate: DeliveryObligation = self.repository.get(self._uuid(obligation_id))
        except AggregateNotFoundError:
            raise NotFound("obligation", obligation_id) from None
        assert isinstance(aggregate, DeliveryObligation)
        return aggregate

    def save_transition(self, obligation: DeliveryObligation, transition: str) -> None:
        """Append the obligation's pending events at its next versions.

        ``ConcurrentUpdate`` when another writer appended first (the aggregate version is
        the lock): nothing of it is stored; reload and decide again. ``transition`` names
        the change in that error and in the log.
        """
        try:
            self._store(obligation)
        except IntegrityError:
            log.info(
                "obligation %s: %s lost to a concurrent writer",
                obligation.obligation_id,
                transition,
            )
            raise ConcurrentUpdate(
                "DeliveryObligation", obligation.obligation_id, transition
            ) from None
        log.debug("obligation %s %s v%d", obligation.obligation_id, transition, obligation.version)

    def change(
        self,
        obligation_id: str,
        transition: str,
        decide: Callable[[DeliveryObligation], object],
    ) -> DeliveryObligation:
        """Let ``decide`` run one of the obligation's commands, then append what it decided;
        returns the obligation as changed.

        The obligation this ledger wrote last is kept decrypted (``kept``), so a
        lifecycle's next change needs no reload. A kept copy may be behind the store
        (another process wrote since): a write on top of it fails on the version, and so
        does not count; the change is then decided again on the obligation as stored now,
        exactly as without the copy (and so is one the copy refused). Only a change
        decided on the stored state raises ``ConcurrentUpdate`` or the refusal.
        """
        kept: DeliveryObligation | None = self.kept.take(self._uuid(obligation_id))
        if kept is not None:
            try:
                decide(kept)
                self._store(kept)
            except IntegrityError:
                log.debug("obligation %s changed since it was kept: reloaded", obligation_id)
            except LedgerError:
                pass  # refused on the kept copy: the stored state decides
            else:
                self.kept.keep(kept)
                log.debug("obligation %s %s v%d", obligation_id, transition, kept.version)
                return kept
        obligation = self.load(obligation_id)
        decide(obligation)
        self.save_transition(obligation, transition)
        self.kept.keep(obligation)
        return obligation

    def _store(self, obligation: DeliveryObligation) -> None:
        """The obligation's pending events, through the application's one write path."""
        self.sealed_events.append(obligation.collect_events())

    def store_changes(self, obligations: Sequence[DeliveryObligation]) -> Sequence[Recording[UUID]]:
        """The pending events of several obligations in one transaction, through the one
        write path (not the library's ``save``: no protocol checks), with where the log put
        them, for a view to follow (``MaterializedView.follow``). The library's
        ``IntegrityError`` when any of them lost a race: then none of them is stored."""
        return self.sealed_events.put([e for o in obligations for e in o.collect_events()])
