"""The DeliveryObligation aggregate: one final reply the gateway owes a user.

Commands (``record``, ``start_attempt``, ``confirm_delivery``, ``fail``, ``claim``,
``request_retry``, ``abandon``) validate and decide; the ``@event`` methods only mutate,
because they are re-run every time the aggregate is reloaded from its events.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.topics import stored_as
from gateway_ledger.domain.values import (
    MAX_CONTENT_BYTES,
    MAX_REASON_CHARS,
    UNRESOLVED_STATES,
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
    SendGuard,
    cut_error,
    receipt_ids,
    require_aware,
    require_choice,
    require_clear_text,
    require_metadata,
    require_text,
)

OBLIGATION_NAMESPACE = uuid5(NAMESPACE_URL, "https://gateway-ledger/obligation")


def compute_obligation_id(session_key: str, message_ref: str, content: str) -> str:
    """Stable id: same turn + same content re-records idempotently (upstream, verbatim)."""
    payload = f"{session_key}|{message_ref}|{content}"
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


def _send_guard(value: SendGuard | str) -> str:
    try:
        return SendGuard(value).value
    except ValueError:
        raise InvalidInput(f"unknown send guard {value!r}") from None


def obligation_uuid(obligation_id: str) -> UUID:
    """The aggregate id of an obligation: uuid5 of its 24-hex obligation id."""
    return uuid5(OBLIGATION_NAMESPACE, obligation_id)


def _event_class(aggregate: type, name: str) -> Any:
    """The event class an ``@event(name)`` method of the aggregate triggers."""
    return getattr(aggregate, name)


MAX_OBLIGATION_ID_CHARS = 200
"""Upstream's ids are 24 hex characters; an embedder's own ids get room, not a document."""


def require_obligation_id(value: object) -> str:
    """An obligation id as every command and every lookup takes it (kept in clear)."""
    return require_clear_text("obligation_id", value, max_chars=MAX_OBLIGATION_ID_CHARS)


RECORD_FIELDS = ("session_key", "target", "content", "parts", "media", "metadata")
"""What a caller says when it records a reply; the owner and the time are the recorder's."""


def record_differences(recorded: Any, candidate: Any) -> tuple[str, ...]:
    """The fields of :data:`RECORD_FIELDS` in which two records of one id differ.

    The id is a hash of the turn and the content, so the same id with other content is a
    caller's bug (ConflictingRecord); the same record again is idempotent. Each argument
    is anything with those attributes: an obligation, or its stored ``Recorded`` event.
    """
    return tuple(
        name
        for name in RECORD_FIELDS
        if _comparable(getattr(recorded, name)) != _comparable(getattr(candidate, name))
    )


def _comparable(value: Any) -> Any:
    """Sequences compare as lists: a record read back has lists where a caller gave tuples."""
    return list(value) if isinstance(value, tuple) else value


def _operator_reason(detail: object) -> str:
    """An operator who stops owing a reply says why, in a sentence (the history keeps it)."""
    return require_clear_text("abandon reason", detail, max_chars=MAX_REASON_CHARS)


@stored_as("gateway_ledger.domain.obligation")
class DeliveryObligation(Aggregate):
    """A reply owed to one chat target, from the moment it is recorded until it is resolved."""

    obligation_id: str
    session_key: str
    target: DeliveryTarget
    content: str
    parts: list[str]
    media: list[MediaItem]
    metadata: dict[str, Any]
    owner: OwnerIdentity
    recorded_at: datetime
    state: ObligationState
    recovery_attempts: int
    send_attempts: int
    fence: int
    may_have_arrived: bool
    arrived_before_this_send: bool
    last_error: str
    error_class: ErrorClass | None
    retry_after: float | None
    receipt: list[str]
    delivered_parts: dict[str, list[str]]
    abandon_reason: AbandonReason | None
    quarantine_reason: QuarantineReason | None
    last_transition_at: datetime

    # -- creation ---------------------------------------------------------------------------

    @staticmethod
    def create_id(obligation_id: str) -> UUID:
        return obligation_uuid(obligation_id)

    @classmethod
    def record(
        cls,
        *,
        obligation_id: str,
        session_key: str,
        target: DeliveryTarget,
        content: str,
        owner: OwnerIdentity,
        now: datetime,
        parts: Sequence[str] = (),
        media: Iterable[MediaItem] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> DeliveryObligation:
        """Validate everything before the first event exists: bad input writes nothing."""
        require_obligation_id(obligation_id)
        require_text("session_key", session_key)
        if not isinstance(target, DeliveryTarget):
            raise InvalidInput("target must be a DeliveryTarget")
        require_text("content", content, allow_empty=True)
        if (
            len(content) * 4 > MAX_CONTENT_BYTES
            and len(content.encode("utf-8")) > MAX_CONTENT_BYTES
        ):
            raise InvalidInput(f"content is larger than {MAX_CONTENT_BYTES} bytes")
        if not isinstance(owner, OwnerIdentity):
            raise InvalidInput("owner must be an OwnerIdentity")
        require_aware("now", now)
        if isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
            raise InvalidInput(f"parts must be a sequence of str, not {type(parts).__name__}")
        part_list = [require_text(f"parts[{i}]", p, allow_empty=True) for i, p in enumerate(parts)]
        if part_list and "".join(part_list) != content:
            raise InvalidInput("parts must be the content split in order, nothing added or lost")
        if isinstance(media, str | bytes | Mapping) or not isinstance(media, Iterable):
            raise InvalidInput(f"media must be a list of MediaItem, not {type(media).__name__}")
        media_list = list(media)
        for item in media_list:
            if not isinstance(item, MediaItem):
                raise InvalidInput("media must hold MediaItem values")
        meta = require_metadata("metadata", metadata)
        # ``_create`` with the event class is what ``cls(...)`` does after mapping its
        # arguments to keywords, which they already are (ADR 0015: hot path).
        recorded: Any = cls._create(
            _event_class(cls, "Recorded"),
            obligation_id=obligation_id,
            session_key=session_key,
            target=target,
            content=content,
            parts=part_list,
            media=media_list,
            metadata=meta,
            owner=owner,
            timestamp=now,
        )
        return recorded  # type: ignore[no-any-return]

    @event("Recorded")
    def __init__(
        self,
        obligation_id: str,
        session_key: str,
        target: DeliveryTarget,
        content: str,
        parts: list[str],
        media: list[MediaItem],
        metadata: dict[str, Any],
        owner: OwnerIdentity,
        timestamp: datetime,
    ) -> None:
        self.obligation_id = obligation_id
        self.session_key = session_key
        self.target = target
        self.content = content
        self.parts = list(parts)
        self.media = list(media)
        self.metadata = dict(metadata)
        self.owner = owner
        self.recorded_at = timestamp
        self.state = ObligationState.PENDING
        self.recovery_attempts = 0  # claims by a recovery sweep; capped by the policy
        self.send_attempts = 0
        self.fence = 0  # bumped by every claim: a superseded owner is fenced out
        self.may_have_arrived = False
        self.arrived_before_this_send = False
        self.last_error = ""
        self.error_class = None
        self.retry_after: float | None = None
        self.receipt = []
        self.delivered_parts = {}  # part index (as str, a JSON key) -> platform message ids
        self.abandon_reason = None
        self.quarantine_reason = None
        self.last_transition_at = timestamp

    # -- derived facts ----------------------------------------------------------------------

    @property
    def needs_marker(self) -> bool:
        """True when a previous send may have reached the user, so a re-send may duplicate."""
        return self.may_have_arrived

    @property
    def part_count(self) -> int:
        """Text chunks (or the whole content, when not empty) followed by media items."""
        text_parts = len(self.parts) if self.parts else (1 if self.content else 0)
        return text_parts + len(self.media)

    def part_delivered(self, index: int) -> bool:
        return str(index) in self.delivered_parts

    @property
    def is_resolved(self) -> bool:
        return self.state.is_final

    @property
    def platform(self) -> str:
        return self.target.platform

    def _trigger(self, name: str, **kwargs: Any) -> None:
        """Trigger the ``@event`` named ``name`` with these keyword arguments.

        The same event and the same mutation (its ``@event`` method's body) as calling
        the decorated method, without the decorator's per-call argument mapping, which
        costs as much as the rest of the event (ADR 0015). For the delivery hot path.
        """
        self.trigger_event(_event_class(type(self), name), **kwargs)

    def _refuse(self, transition: str, why: str = "") -> IllegalTransition:
        return IllegalTransition(
            "DeliveryObligation", self.obligation_id, self.state.value, transition, why
        )

    def _require_state(self, transition: str, *allowed: ObligationState) -> None:
        if self.state not in allowed:
            raise self._refuse(transition)

    @property
    def is_quarantined(self) -> bool:
        return self.quarantine_reason is not None

    def _require_not_quarantined(self, transition: str) -> None:
        """Nothing unreadable is ever sent: a quarantined obligation is never sent again."""
        if self.is_quarantined:
            assert self.quarantine_reason is not None
            raise self._refuse(transition, f"quarantined ({self.quarantine_reason.value})")

    # -- commands and their events ----------------------------------------------------------

    def start_attempt(
        self, *, by: OwnerIdentity, now: datetime, guard: SendGuard | str | None = None
    ) -> None:
        """The holder starts a send. After a claim, only the claimer may (fencing).

        ``guard`` is what the sender does against an unannounced duplicate (ADR 0026):
        recorded so that the audit reads it instead of inferring it. None: not said.
        """
        require_aware("now", now)
        said = None if guard is None else _send_guard(guard)
        self._require_state("attempting", ObligationState.PENDING, ObligationState.FAILED)
        self._require_not_quarantined("attempting")
        if self.fence > 0 and by != self.owner:
            raise self._refuse("attempting", f"claimed by {self.owner.describe()}; fenced out")
        self._trigger("Attempting", by=by, fence=self.fence, timestamp=now, guard=said)

    @event("Attempting")
    def _attempting(
        self, by: OwnerIdentity, fence: int, timestamp: datetime, guard: str | None = None
    ) -> None:
        self.state = ObligationState.ATTEMPTING
        self.owner = by
        self.send_attempts += 1
        self.arrived_before_this_send = self.may_have_arrived
        self.may_have_arrived = True
        self.retry_after = None
        self.last_transition_at = timestamp

    def confirm_delivery(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        receipt: Sequence[str | int] = (),
        fence: int | None = None,
    ) -> None:
        """The send succeeded. From a fenced-out reporter it is recorded as a late result.

        ``fence`` is the fence the reporter held when it started the send; when unknown,
        a reporter other than the owner after a claim is taken as fenced out.
        """
        require_aware("now", now)
        ids = receipt_ids(receipt)
        if self.is_fenced_out(by, fence):
            self._report_late(by, now, fence, "delivered", receipt=ids)
            return
        self._require_state("delivered", ObligationState.ATTEMPTING, ObligationState.CLAIMED)
        self._trigger("Delivered", by=by, receipt=ids, fence=self.fence, timestamp=now)

    @event("Delivered")
    def _delivered(
        self, by: OwnerIdentity, receipt: list[str], fence: int, timestamp: datetime
    ) -> None:
        self.state = ObligationState.DELIVERED
        self.receipt = list(receipt)
        self.last_transition_at = timestamp

    def acknowledge_part(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        index: int,
        receipt: Sequence[str | int] = (),
        fence: int | None = None,
    ) -> None:
        """One part of a multi-part reply was confirmed: recovery re-sends only the others."""
        require_aware("now", now)
        if not isinstance(index, int) or isinstance(index, bool):
            raise InvalidInput("part index must be an int")
        if not 0 <= index < self.part_count:
            raise InvalidInput(f"part index {index} is outside 0..{self.part_count - 1}")
        if self.is_fenced_out(by, fence):
            ids = receipt_ids(receipt)
            self._report_late(by, now, fence, "part_delivered", receipt=ids, part=index)
            return
        self._require_state(
            f"part {index} delivered", ObligationState.ATTEMPTING, ObligationState.CLAIMED
        )
        if self.part_delivered(index):
            raise self._refuse(f"part {index} delivered", "that part is already confirmed")
        ids = receipt_ids(receipt)
        self._part_delivered(by=by, index=index, receipt=ids, fence=self.fence, timestamp=now)

    @event("PartDelivered")
    def _part_delivered(
        self, by: OwnerIdentity, index: int, receipt: list[str], fence: int, timestamp: datetime
    ) -> None:
        self.delivered_parts[str(index)] = list(receipt)
        self.last_transition_at = timestamp

    def fail(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        error: str = "",
        classification: ErrorClass = ErrorClass.AMBIGUOUS,
        retry_after: float | None = None,
        fence: int | None = None,
    ) -> None:
        """The send failed. From a fenced-out reporter it is recorded as a late result."""
        require_aware("now", now)
        if not isinstance(error, str):
            raise InvalidInput("error must be a str")
        try:
            classification = ErrorClass(classification)
        except ValueError:
            raise InvalidInput(f"unknown error classification {classification!r}") from None
        if retry_after is not None and (
            not isinstance(retry_after, int | float)
            or isinstance(retry_after, bool)
            or not math.isfinite(retry_after)
            or retry_after < 0
        ):
            raise InvalidInput("retry_after must be a finite, non-negative number of seconds")
        text = cut_error(error)
        if self.is_fenced_out(by, fence):
            self._report_late(
                by, now, fence, "failed", error=text, classification=classification.value
            )
            return
        self._require_state("failed", ObligationState.ATTEMPTING, ObligationState.CLAIMED)
        self._failed(
            by=by,
            error=text,
            classification=classification.value,
            retry_after=None if retry_after is None else float(retry_after),
            fence=self.fence,
            timestamp=now,
        )

    @event("Failed")
    def _failed(
        self,
        by: OwnerIdentity,
        error: str,
        classification: str,
        retry_after: float | None,
        fence: int,
        timestamp: datetime,
    ) -> None:
        self.state = ObligationState.FAILED
        self.last_error = error
        self.error_class = ErrorClass(classification)
        self.retry_after = retry_after
        if not self.error_class.may_have_arrived:
            # The platform said no: this send did not reach the user. Earlier sends that
            # might have are already on record, so only an ambiguous failure raises the flag.
            self.may_have_arrived = self.arrived_before_this_send
        self.last_transition_at = timestamp

    # -- fencing: results from an owner whose claim was superseded (ADR 0010) ---------------

    def is_fenced_out(self, by: OwnerIdentity, fence: int | None = None) -> bool:
        """True when ``by`` lost the obligation to a later claim.

        With the reporter's fence: it is older than the current one. Without: after a claim
        (fence > 0) only the current owner speaks for the obligation.
        """
        if fence is not None:
            if not isinstance(fence, int) or isinstance(fence, bool) or fence < 0:
                raise InvalidInput("fence must be a non-negative int")
            return fence < self.fence
        return self.fence > 0 and by != self.owner

    def _report_late(
        self,
        by: OwnerIdentity,
        now: datetime,
        fence: int | None,
        outcome: str,
        *,
        receipt: Sequence[str] = (),
        error: str = "",
        classification: str | None = None,
        part: int | None = None,
    ) -> None:
        self._late_result(
            by=by,
            outcome=outcome,
            receipt=list(receipt),
            error=error,
            classification=classification,
            part=part,
            fence=fence,
            current_fence=self.fence,
            late=True,
            timestamp=now,
        )

    @event("LateResultReported")
    def _late_result(
        self,
        by: OwnerIdentity,
        outcome: str,
        receipt: list[str],
        error: str,
        classification: str | None,
        part: int | None,
        fence: int | None,
        current_fence: int,
        late: bool,
        timestamp: datetime,
    ) -> None:
        """A fenced-out owner's result: a fact for history and audit, never a transition.

        The state stays the current owner's. A late success proves the reply reached the
        user, so any later send of it may only go out as a possible duplicate.
        """
        if outcome == "delivered":
            self.may_have_arrived = True
            self.arrived_before_this_send = True

    def claim(self, *, by: OwnerIdentity, now: datetime, policy: LedgerPolicy) -> None:
        """A recovery sweep takes the obligation over from a dead owner."""
        require_aware("now", now)
        self._require_state("claimed", *UNRESOLVED_STATES)
        self._require_not_quarantined("claimed")
        if by == self.owner:
            raise self._refuse("claimed", "a process never claims its own obligation")
        if self.recovery_attempts >= policy.max_attempts:
            raise self._refuse("claimed", f"{self.recovery_attempts} recovery claims already")
        self._claimed(
            by=by,
            previous_owner=self.owner,
            recovery_attempt=self.recovery_attempts + 1,
            needs_marker=self.may_have_arrived,
            fence=self.fence + 1,
            timestamp=now,
        )

    @event("Claimed")
    def _claimed(
        self,
        by: OwnerIdentity,
        previous_owner: OwnerIdentity,
        recovery_attempt: int,
        needs_marker: bool,
        fence: int,
        timestamp: datetime,
    ) -> None:
        self.state = ObligationState.CLAIMED
        self.owner = by
        self.recovery_attempts = recovery_attempt
        self.fence = fence
        # The claimer sends at once: from here on a send may have started.
        self.arrived_before_this_send = needs_marker
        self.may_have_arrived = True
        self.last_transition_at = timestamp

    def request_retry(self, *, by: OwnerIdentity, now: datetime, requested_by: str = "") -> None:
        """An operator asks for another try: any gateway's next sweep may claim it at once.

        The operator becomes the owner (so the previous owner is fenced out and the sweep
        never asks whether it is alive), the recovery budget starts again, and the marker
        flag is kept: a re-send after a send that may have arrived is still labelled.
        """
        require_aware("now", now)
        self._require_state("retry requested", *UNRESOLVED_STATES)
        self._require_not_quarantined("retry requested")
        require_clear_text("requested_by", requested_by, allow_empty=True)
        self._retry_requested(
            by=by,
            previous_owner=self.owner,
            requested_by=requested_by,
            fence=self.fence + 1,
            timestamp=now,
        )

    @event("RetryRequested")
    def _retry_requested(
        self,
        by: OwnerIdentity,
        previous_owner: OwnerIdentity,
        requested_by: str,
        fence: int,
        timestamp: datetime,
    ) -> None:
        self.state = ObligationState.PENDING
        self.owner = by
        self.fence = fence
        self.recovery_attempts = 0
        self.retry_after = None
        self.last_transition_at = timestamp

    def abandon(
        self,
        *,
        reason: AbandonReason,
        now: datetime,
        by: OwnerIdentity | None = None,
        detail: str = "",
    ) -> None:
        require_aware("now", now)
        reason = require_choice("abandon reason", reason, AbandonReason)
        self._require_state(f"abandoned ({reason.value})", *UNRESOLVED_STATES)
        if reason is AbandonReason.OPERATOR:
            detail = _operator_reason(detail)
        elif not isinstance(detail, str):
            raise InvalidInput("detail must be a str")
        else:
            detail = cut_error(detail)  # a platform's or a sweep's words: kept, never refused
        self._abandoned(reason=reason.value, detail=detail, by=by, timestamp=now)

    @event("Abandoned")
    def _abandoned(
        self, reason: str, detail: str, by: OwnerIdentity | None, timestamp: datetime
    ) -> None:
        self.state = ObligationState.ABANDONED
        self.abandon_reason = AbandonReason(reason)
        self.last_transition_at = timestamp

    def quarantine(
        self,
        *,
        reason: QuarantineReason,
        found_at: int,
        by: OwnerIdentity,
        now: datetime,
    ) -> None:
        """A reader found event ``found_at`` unreadable (its sealed fields fail
        authentication): the obligation is never sent again, only abandoned (ADR 0027).

        Like a claim, it takes the obligation from its owner (a new fence), so an owner that
        was only paused reports late instead of resolving it.
        """
        require_aware("now", now)
        reason = require_choice("quarantine reason", reason, QuarantineReason)
        if not isinstance(found_at, int) or isinstance(found_at, bool) or found_at < 1:
            raise InvalidInput("found_at must be an event version (an int >= 1)")
        self._require_state("quarantined", *UNRESOLVED_STATES)
        self._require_not_quarantined("quarantined")
        self._quarantined(
            by=by,
            previous_owner=self.owner,
            reason=reason.value,
            found_at=found_at,
            fence=self.fence + 1,
            timestamp=now,
        )

    @event("Quarantined")
    def _quarantined(
        self,
        by: OwnerIdentity,
        previous_owner: OwnerIdentity,
        reason: str,
        found_at: int,
        fence: int,
        timestamp: datetime,
    ) -> None:
        self.quarantine_reason = QuarantineReason(reason)
        self.owner = by
        self.fence = fence
        self.last_transition_at = timestamp
