"""The record that a subject's personal data was erased: who, when, what was affected.

Erasure destroys a key outside the domain; the fact that it happened belongs to the audit
trail, so it is an event like any other. It carries no personal data: the subject is
named by its keyed hash, never by its session key.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from eventsourcing.domain import Aggregate, event

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.events import fields_set_once
from gateway_ledger.domain.topics import stored_as
from gateway_ledger.domain.values import OwnerIdentity, require_aware, require_clear_text


@stored_as(
    "gateway_ledger.domain.erasure",
    formerly={"SubjectForgotten": ("SubjectErased",)},  # renamed in 0.2.0 (ADR 0055)
)
@fields_set_once
class Erasure(Aggregate):
    """One execution of the right to be forgotten for one subject."""

    subject_id: str
    by: OwnerIdentity
    requested_by: str
    destroyed_keys: list[str]
    abandoned: list[str]
    sessions: list[str]
    erased_at: datetime

    class SubjectForgotten(Aggregate.Created):
        """The subject's keys ``destroyed_keys`` were destroyed by ``by`` (for
        ``requested_by``); its unresolved obligations ``abandoned``, its conversations
        ``sessions`` (None: recorded before erasures listed them)."""

        subject_id: str
        by: OwnerIdentity
        requested_by: str
        destroyed_keys: list[str]
        abandoned: list[str]
        sessions: list[str] | None

    @classmethod
    def record(
        cls,
        *,
        erasure_id: UUID,
        subject_id: str,
        by: OwnerIdentity,
        requested_by: str,
        destroyed_keys: Sequence[str],
        abandoned: Sequence[str],
        now: datetime,
        sessions: Sequence[str] = (),
    ) -> Erasure:
        require_clear_text("subject_id", subject_id)
        if not isinstance(by, OwnerIdentity):
            raise InvalidInput("by must be an OwnerIdentity")
        require_clear_text("requested_by", requested_by, allow_empty=True)
        require_aware("now", now)
        if not isinstance(erasure_id, UUID):
            raise InvalidInput("erasure_id must be a UUID")
        return cls._create(
            cls.SubjectForgotten,
            id=erasure_id,
            subject_id=subject_id,
            by=by,
            requested_by=requested_by,
            destroyed_keys=[require_clear_text("key id", k) for k in destroyed_keys],
            abandoned=[require_clear_text("obligation id", o) for o in abandoned],
            sessions=[require_clear_text("session id", s) for s in sessions],
            timestamp=now,
        )

    @event(SubjectForgotten)
    def __init__(
        self,
        subject_id: str,
        by: OwnerIdentity,
        requested_by: str,
        destroyed_keys: list[str],
        abandoned: list[str],
        timestamp: datetime,
        sessions: list[str] | None = None,
    ) -> None:
        self.subject_id = subject_id
        self.by = by
        self.requested_by = requested_by
        self.destroyed_keys = list(destroyed_keys)
        self.abandoned = list(abandoned)
        self.sessions = list(sessions or ())  # the erased conversations (none before v2)
        self.erased_at = timestamp
