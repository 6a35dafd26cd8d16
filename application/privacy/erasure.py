"""Privacy of the ledger: which fields are personal, and erasure that keeps the audit trail.

Personal fields are sealed by the store's mapper (``infrastructure/privacy/private_mapper.py``)
under one data key per session key. ``forget_session`` destroys that key: every event
still replays, with ``[erased]`` where the personal data was, and every unresolved
obligation of the session is abandoned with reason ``erased`` instead of being sent.
See ADR 0012 for what this guarantees and what it cannot, and ADR 0028 for writes that
race an erasure (refused with ``SessionErased``) and for cleanup that a reader keeps from
finishing (left pending, finished by the next erasure or ``finish_erasure_cleanup``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID, uuid4

import attrs
import orjson
from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import IntegrityError

from gateway_ledger.application.privacy.policy import (
    InClear,
    PrivacyPolicy,
    SealedEvent,
    SealedSnapshot,
)
from gateway_ledger.application.privacy.ports import ErasableLedger, ErasableSessions
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import UndecodableEvent
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.domain.sessions.route import InboundMessage, SessionKeying, SessionRoute
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.sessions.source import PERSONAL_FIELDS, TRUST_FLAGS
from gateway_ledger.domain.topics import topics_of
from gateway_ledger.domain.values import AbandonReason, require_clear_text, require_text

log = logging.getLogger("gateway_ledger.privacy")

__all__ = [
    "CLEANUP_PENDING_NOTE",
    "DELIVERY_PRIVACY",
    "SESSION_PRIVACY",
    "ErasureReport",
    "forget_in_ledger",
]

CLEANUP_PENDING_NOTE = (
    "cleanup pending: an open reader or transaction kept an old copy of the destroyed key "
    "in the store's files (SQLite WAL, or PostgreSQL's key table before VACUUM FULL); the "
    "key can no longer be used, and the next `gateway-ledger sessions forget`, or "
    "`gateway-ledger sessions forget --finish`, removes the copy"
)
"""What an operator is told when an erasure's cleanup was left for later (ADR 0028)."""


DELIVERY_PRIVACY = PrivacyPolicy(
    SealedEvent(
        DeliveryObligation.Recorded,
        (
            "session_key",
            "content",
            "parts",
            "media",
            "metadata",
            "target.chat_id",
            "target.thread_id",
            "target.reply_to",
        ),
        subject_from="session_key",
        clear=("obligation_id", "target.platform", "owner"),
        dated_by_the_ledger=True,
    ),
    InClear(DeliveryObligation.Attempting, ("by", "fence", "guard", "needs_marker")),
    SealedEvent(DeliveryObligation.PartDelivered, ("receipt",), clear=("by", "index", "fence")),
    SealedEvent(DeliveryObligation.Delivered, ("receipt",), clear=("by", "fence")),
    SealedEvent(
        DeliveryObligation.Failed,
        ("error",),
        clear=("by", "classification", "retry_after", "fence", "may_have_arrived"),
    ),
    SealedEvent(
        DeliveryObligation.LateResultReported,
        ("receipt", "error"),
        clear=(
            "by",
            "outcome",
            "classification",
            "part",
            "fence",
            "current_fence",
            "late",
            "may_have_arrived",
        ),
    ),
    InClear(
        DeliveryObligation.Claimed,
        (
            "by",
            "previous_owner",
            "recovery_attempt",
            "needs_marker",
            "fence",
            "previous_owner_gone",
            "records_send",
        ),
    ),
    InClear(DeliveryObligation.RecoverySendStarted, ("by", "fence")),
    InClear(DeliveryObligation.Waited, ("by", "reason", "seconds")),
    InClear(DeliveryObligation.OrderReleased, ("by", "behind", "reason", "waited")),
    InClear(DeliveryObligation.RetryRequested, ("by", "previous_owner", "requested_by", "fence")),
    InClear(
        DeliveryObligation.DeadLetterRetried,
        (
            "by",
            "previous_owner",
            "requested_by",
            "fence",
            "obligation_id",
            "platform",
            "recorded_at",
        ),
    ),
    SealedEvent(DeliveryObligation.Abandoned, ("detail",), clear=("reason", "by", "error_class")),
    InClear(
        DeliveryObligation.Quarantined, ("by", "previous_owner", "reason", "found_at", "fence")
    ),
    SealedEvent(
        DeliveryObligation.Reconciled,
        ("evidence", "message_ids"),
        clear=(
            "by",
            "fence",
            "outcome",
            "part",
            "completes",
            "claim_pending",
            "may_have_arrived",
            "stray_send_possible",
        ),
    ),
    SealedEvent(
        DeliveryObligation.StatusReported,
        ("detail", "message_id"),
        clear=(
            "by",
            "status",
            "reported_at",
            "may_have_arrived",
            "obligation_id",
            "owner",
            "platform",
            "recorded_at",
            "recovery_attempts",
            "part",
        ),
    ),
    SealedEvent(
        DeliveryObligation.Imported,
        ("last_error",),
        clear=(
            "source",
            "source_state",
            "attempts",
            "created_at",
            "updated_at",
            "time_basis",
            "possibly_sent",
        ),
    ),
    InClear(
        Erasure.SubjectForgotten,
        ("subject_id", "by", "requested_by", "destroyed_keys", "abandoned", "sessions"),
    ),
)
"""Personal: what was said, to whom, where, and what the platform echoed back (every
receipt: whole replies, parts, late results). In clear: obligation id, states, times,
attempts, fences, platform, owners (the gateway's identity), error class, operator labels,
and the erasure records (subject ids are keyed hashes)."""


SOURCE_FIELDS = tuple(f"source.{name}" for name in PERSONAL_FIELDS)
"""Who and where, in a SessionSource. In clear: platform, chat_type, is_bot, profile."""

SOURCE_CLEAR = tuple(
    f"source.{name}" for name in ("platform", "chat_type", "is_bot", "profile", *TRUST_FLAGS)
)
"""In clear in a SessionSource (the trust flags are never stored at all)."""

SESSION_PRIVACY = PrivacyPolicy(
    SealedEvent(
        Session.Started,
        ("key", *SOURCE_FIELDS),
        subject_from="key",
        clear=("session_id", "previous_session_id", "started_reason", *SOURCE_CLEAR),
    ),
    SealedEvent(
        Session.MessageAppended,
        ("content", "platform_message_id"),
        state_free=True,
        clear=("seq", "role"),
    ),
    InClear(Session.ResumeMarked, ("reason",)),
    InClear(Session.ResumeCleared),
    InClear(Session.Suspended),
    InClear(Session.Reset, ("reason", "successor_session_id")),
    InClear(Session.Reopened, ("reason",)),
    SealedEvent(SessionRoute.Opened, ("key",), subject_from="key", clear=("session_id",)),
    InClear(SessionRoute.Rotated, ("previous_session_id", "session_id", "reason")),
    # Keyed hashes of the chat and message ids only (ADR 0013).
    InClear(
        InboundMessage.Seen, ("platform", "chat_scope", "platform_message_id", "session_id", "seq")
    ),
    InClear(SessionKeying.Established, ("mode",)),
    SealedSnapshot(Session, ("key", *SOURCE_FIELDS)),
    SealedSnapshot(SessionRoute, ("key",)),
)
"""Personal: what was said, by whom, where, and the session key (raw ids in raw_keys mode).
In clear: session ids, seq, role, times, counters, reset reasons, platform, chat type.
``InboundMessage`` needs no sealing: the store keys it by keyed hashes only (ADR 0013).
The subject is the session key, as in the ledger: one erasure covers both halves."""

_RETRIES = 5


@attrs.frozen
class ErasureReport:
    """What one erasure did; carries no personal data."""

    subject_id: str
    erasure_id: UUID
    destroyed_keys: tuple[str, ...]
    abandoned: tuple[str, ...]
    erased_at: datetime
    wal_truncated: bool | None
    sessions: tuple[str, ...] = ()
    cleanup_pending: bool = False
    """An old copy of the destroyed key may remain in the store's files until the next
    erasure or ``finish_erasure_cleanup`` (a reader held them; ADR 0028)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "subject_id": self.subject_id,
            "erasure_id": str(self.erasure_id),
            "destroyed_keys": list(self.destroyed_keys),
            "abandoned": list(self.abandoned),
            "sessions": list(self.sessions),
            "erased_at": self.erased_at.isoformat(),
            "wal_truncated": self.wal_truncated,
            "cleanup_pending": self.cleanup_pending,
        }


def forget_in_ledger(
    ledger: ErasableLedger,
    session_key: str,
    *,
    requested_by: str = "",
    sessions: ErasableSessions | None = None,
) -> ErasureReport:
    """Erase both halves of a session: its replies in ``ledger`` and, given the session
    store (``sessions``, in the same store or another), its conversations.

    The open conversation is suspended (the next message starts a fresh session) and
    unresolved obligations are abandoned before the key goes (nothing owed is left behind
    unreadable), and abandoned once more after it (any recorded meanwhile by another
    process). The key is destroyed in the ledger's store and in the session store's; one
    ``SubjectForgotten`` event in the ledger records it all.
    """
    require_text("session_key", session_key)
    require_clear_text("requested_by", requested_by, allow_empty=True)
    mapper = ledger.private_mapper
    subject = mapper.keyring.subject_id(session_key)
    began = ledger.clock()  # a first write made before this is refused (ADR 0071)
    session_ids = sessions.end_for_erasure(session_key) if sessions is not None else []
    abandoned = _abandon_unresolved(ledger, subject)
    destroyed = mapper.keyring.destroy(subject, began)
    truncated = getattr(mapper.keyring.table, "last_checkpoint_complete", None)
    pending = bool(getattr(mapper.keyring.table, "cleanup_pending", False))
    if sessions is not None:
        ring = sessions.private_mapper.keyring
        gone = ring.destroy(ring.subject_id(session_key), began)
        destroyed += [k for k in gone if k not in destroyed]
        pending = pending or bool(getattr(ring.table, "cleanup_pending", False))
        other = getattr(ring.table, "last_checkpoint_complete", None)
        truncated = (
            None
            if truncated is None and other is None
            else bool((truncated is not False) and (other is not False))
        )
    abandoned += _abandon_unresolved(ledger, subject)
    erasure = Erasure.record(
        erasure_id=uuid4(),
        subject_id=subject,
        by=ledger.owner,
        requested_by=requested_by,
        destroyed_keys=destroyed,
        abandoned=abandoned,
        sessions=session_ids,
        now=ledger.clock(),
    )
    ledger.save(erasure)
    report = ErasureReport(
        subject_id=subject,
        erasure_id=erasure.id,
        destroyed_keys=tuple(destroyed),
        abandoned=tuple(abandoned),
        erased_at=erasure.erased_at,
        wal_truncated=truncated,
        sessions=tuple(session_ids),
        cleanup_pending=pending,
    )
    if pending:
        log.warning("subject %s erased; %s", subject, CLEANUP_PENDING_NOTE)
    log.info(
        "subject %s erased: %d key(s) destroyed, %d obligation(s) abandoned, %d session(s)",
        subject,
        len(destroyed),
        len(abandoned),
        len(session_ids),
    )
    return report


def obligations_of(ledger: ErasableLedger, subject_id: str) -> list[UUID]:
    """Every obligation recorded for the subject (found by its clear subject id)."""
    mapper = ledger.private_mapper
    needle = f'"s":"{subject_id}"'.encode()
    topics = [e.topic for e in mapper.policy.events if e.subject_from and _is_obligation(e.event)]
    found = mapper.keyring.table.originators_mentioning(topics, needle)
    return [UUID(o) for o in found]


def _is_obligation(event_class: type) -> bool:
    return event_class.__qualname__.startswith(DeliveryObligation.__qualname__ + ".")


def _abandon_unresolved(ledger: ErasableLedger, subject_id: str) -> list[str]:
    abandoned: list[str] = []
    for aggregate_id in obligations_of(ledger, subject_id):
        for _ in range(_RETRIES):
            try:
                obligation: object = ledger.repository.get(aggregate_id)
            except AggregateNotFoundError:
                break
            except UndecodableEvent as e:
                # Quarantined (ADR 0027): never sent; its key goes with the others below.
                log.error("obligation %s not abandoned: %s", aggregate_id, e)
                break
            if not isinstance(obligation, DeliveryObligation) or obligation.is_resolved:
                break
            if ledger.private_mapper.subject_of(aggregate_id) != subject_id:
                break
            obligation.abandon(reason=AbandonReason.ERASED, now=ledger.clock(), by=ledger.owner)
            try:
                ledger.save(obligation)
            except IntegrityError:
                continue  # a concurrent transition: reload and decide again
            abandoned.append(obligation.obligation_id)
            break
        else:
            log.warning("obligation %s kept changing; not abandoned", aggregate_id)
    return abandoned


def is_erased(ledger: ErasableLedger, aggregate_id: UUID) -> bool:
    """True when the obligation's personal data can no longer be opened (its key is gone).

    A recovery path checks this before sending: such an obligation is abandoned with
    reason ``erased``, never sent as ``[erased]``. Costs one indexed read, no decryption.
    """
    mapper = ledger.private_mapper
    stored = mapper.first_event(aggregate_id) if mapper.first_event else None
    if stored is None or b'"_sealed_"' not in stored.state:
        return False
    envelope = orjson.loads(stored.state)["_sealed_"]
    return "k" in envelope and mapper.keyring.opening_key(envelope["s"], envelope["k"]) is None


def erasures(ledger: ErasableLedger) -> list[Erasure]:
    """Every erasure recorded in this store, oldest first (for audits)."""
    topics = topics_of(Erasure.SubjectForgotten)  # with its former topic (ADR 0055)
    found: list[Erasure] = []
    start = None
    while True:
        batch = ledger.recorder.select_notifications(
            start, 500, topics=topics, inclusive_of_start=start is None
        )
        if not batch:
            return found
        for n in batch:
            found.append(ledger.repository.get(n.originator_id))
        start = batch[-1].id
        if len(batch) < 500:
            return found
