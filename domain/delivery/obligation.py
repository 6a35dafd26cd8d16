"""The DeliveryObligation aggregate: one final reply the gateway owes a user.

Commands (``record``, ``start_attempt``, ``confirm_delivery``, ``fail``, ``claim``,
``request_retry``, ``abandon``, ``quarantine``) check their named guards (``check_...``),
decide, and trigger one explicit event class each (ADR 0039). An event's ``apply`` only mutates,
because it is re-run every time the aggregate is reloaded from its events; whatever a
reader needs to know of a decision (the duplicate marker) is carried by the event itself.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic

from gateway_ledger.domain.delivery.marker import NOTHING_SENT, Marker, SendFact, marker_after
from gateway_ledger.domain.delivery.ordering import OrderRelease, WaitReason, require_wait
from gateway_ledger.domain.delivery.reconciliation import (
    ACCEPTED_RANK,
    PlatformStatus,
    ReconcileOutcome,
)
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.events import fields_set_once
from gateway_ledger.domain.topics import stored_as
from gateway_ledger.domain.values import (
    KNOWN_LISTS,
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
    is_item_list,
    receipt_ids,
    require_aware,
    require_choice,
    require_clear_text,
    require_content,
    require_metadata,
    require_text,
)

OBLIGATION_NAMESPACE = uuid5(NAMESPACE_URL, "https://gateway-ledger/obligation")


def compute_obligation_id(session_key: str, message_ref: str, content: str) -> str:
    """Stable id: same turn + same content re-records idempotently (upstream, verbatim)."""
    payload = f"{session_key}|{message_ref}|{content}"
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


_NAMESPACE_BYTES = OBLIGATION_NAMESPACE.bytes


def obligation_uuid(obligation_id: str) -> UUID:
    """The aggregate id of an obligation: uuid5 of its 24-hex obligation id (computed as
    ``uuid.uuid5`` does, with the namespace's bytes taken once)."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + obligation_id.encode("utf-8"), usedforsecurity=False)
    return UUID(bytes=digest.digest()[:16], version=5)


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


def _retry_after(value: object) -> float | None:
    """A platform's "try again in N seconds": finite and not negative, or not said."""
    if value is None:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise InvalidInput("retry_after must be a finite, non-negative number of seconds")
    return float(value)


def _fence(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput("fence must be a non-negative int")
    return value


@stored_as("gateway_ledger.domain.obligation")
@fields_set_once
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
    marker: Marker
    last_error: str
    error_class: ErrorClass | None
    retry_after: float | None
    receipt: list[str]
    delivered_parts: dict[str, list[str]]
    abandon_reason: AbandonReason | None
    quarantine_reason: QuarantineReason | None
    last_transition_at: datetime
    platform_status: PlatformStatus | None
    """The last status the platform reported after accepting the delivered send (ADR 0050)."""
    status_message_id: str | None
    """The message that status was about, when the platform named it."""
    failures_after_acceptance: int
    """How often a platform dropped a send of it after accepting it (each reopened it)."""
    stray_send_possible: bool
    """A claim took it from an owner only presumed gone, whose send may still land."""
    claim_unsent: bool
    """Its last claimer records each send's start before sending (``Claimed.records_send``)
    and neither that start nor any result of a send of it is on record: that claim reached
    no platform and spent no recovery attempt (ADR 0070)."""
    paced_seconds: float
    """How long its sends waited for order and for the rate budget (ADR 0065)."""
    released_behind: list[str]
    """The earlier replies to its chat it went before, order given up (ADR 0065)."""

    # -- events -----------------------------------------------------------------------------
    #
    # Class names and field names are stored (topic ``gateway_ledger.domain.obligation:
    # DeliveryObligation.<Name>``) and never change; a field may be added with a default,
    # so that events written before it still read.

    class Event(Aggregate.Event):
        """Base of the obligation's events: each says in ``apply`` what it changes."""

        marker_decision = ""
        """The field in which this event type carries the marker's decision ("": none)."""

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            """What an event of this type with these fields says of a send (most: nothing)."""
            return None

        @classmethod
        def marker_from_fields(cls, before: Marker, fields: Mapping[str, Any]) -> Marker:
            """The marker after an event of this type with these (stored) fields: its
            recorded decision, or for an event written before it carried one, derived."""
            return marker_after(before, cls.send_fact(fields), fields.get(cls.marker_decision))

        def marker_after(self, before: Marker) -> Marker:
            """The marker after this event, from the marker before it."""
            return self.marker_from_fields(before, vars(self))

    class Recorded(Event, Aggregate.Created):
        obligation_id: str
        session_key: str
        target: DeliveryTarget
        content: str
        parts: list[str]
        media: list[MediaItem]
        metadata: dict[str, Any]
        owner: OwnerIdentity

        def mutate(self, aggregate: Any) -> Any:
            """The obligation this event creates: what the library's creation event does
            (its base initialiser, then ``apply``) without its generic keyword filtering,
            twice per obligation built or loaded, for an ``__init__`` that takes nothing."""
            assert aggregate is None
            obligation = DeliveryObligation.__new__(DeliveryObligation)
            obligation.__base_init__(self.originator_id, self.originator_version, self.timestamp)
            self.apply(obligation)
            return obligation

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.obligation_id = self.obligation_id
            obligation.session_key = self.session_key
            obligation.target = self.target
            obligation.content = self.content
            obligation.parts = list(self.parts)
            obligation.media = list(self.media)
            obligation.metadata = dict(self.metadata)
            obligation.owner = self.owner
            obligation.recorded_at = self.timestamp
            obligation.state = ObligationState.PENDING
            obligation.recovery_attempts = 0  # claims by a recovery sweep; capped by policy
            obligation.send_attempts = 0
            obligation.fence = 0  # bumped by every claim: a superseded owner is fenced out
            obligation.marker = NOTHING_SENT
            obligation.last_error = ""
            obligation.error_class = None
            obligation.retry_after = None
            obligation.receipt = []
            obligation.delivered_parts = {}  # part index (str, a JSON key) -> message ids
            obligation.abandon_reason = None
            obligation.quarantine_reason = None
            obligation.last_transition_at = self.timestamp
            obligation.platform_status = None
            obligation.status_message_id = None
            obligation.failures_after_acceptance = 0
            obligation.stray_send_possible = False
            obligation.claim_unsent = False
            obligation.paced_seconds = 0.0
            obligation.released_behind = []

    class Attempting(Event):
        """The owner starts a send. ``guard``: what the sender did against an unannounced
        duplicate (ADR 0026; None: not said). ``needs_marker``: whether an earlier send may
        have arrived, so this one needed the marker (None: written before it was said)."""

        by: OwnerIdentity
        fence: int
        guard: str | None = None
        needs_marker: bool | None = None

        marker_decision = "needs_marker"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            return SendFact.STARTED

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.state = ObligationState.ATTEMPTING
            obligation.owner = self.by
            obligation.send_attempts += 1
            obligation.claim_unsent = False
            obligation.marker = self.marker_after(obligation.marker)
            obligation.retry_after = None
            obligation.last_transition_at = self.timestamp

    class Delivered(Event):
        by: OwnerIdentity
        receipt: list[str]
        fence: int

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.state = ObligationState.DELIVERED
            obligation.receipt = list(self.receipt)
            obligation.platform_status = None  # accepted: no status reported for this send yet
            obligation.last_transition_at = self.timestamp

    class PartDelivered(Event):
        by: OwnerIdentity
        index: int
        receipt: list[str]
        fence: int

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.delivered_parts[str(self.index)] = list(self.receipt)
            obligation.claim_unsent = False  # a result of the claimer's send: it started
            obligation.last_transition_at = self.timestamp

    class Failed(Event):
        """The send in flight failed. ``may_have_arrived``: whether, after this failure,
        some send may have reached the user (None: written before it was said)."""

        by: OwnerIdentity
        error: str
        classification: str
        retry_after: float | None
        fence: int
        may_have_arrived: bool | None = None

        marker_decision = "may_have_arrived"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            return SendFact.failure(ErrorClass(fields["classification"]))

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.state = ObligationState.FAILED
            obligation.last_error = self.error
            obligation.error_class = ErrorClass(self.classification)
            obligation.retry_after = self.retry_after
            obligation.claim_unsent = False  # a result of the claimer's send: it started
            obligation.marker = self.marker_after(obligation.marker)
            obligation.last_transition_at = self.timestamp

    class LateResultReported(Event):
        """A fenced-out owner's result (ADR 0010): a fact for history and audit, never a
        transition; the state stays the current owner's. ``may_have_arrived`` as in
        ``Failed``: a late success proves the reply reached the user."""

        by: OwnerIdentity
        outcome: str
        receipt: list[str]
        error: str
        classification: str | None
        part: int | None
        fence: int | None
        current_fence: int
        late: bool
        may_have_arrived: bool | None = None

        marker_decision = "may_have_arrived"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            return SendFact.late_result(fields["outcome"])

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.marker = self.marker_after(obligation.marker)

    class Claimed(Event):
        """A recovery sweep took the obligation over; the claimer sends at once, with the
        marker when ``needs_marker`` (an earlier send may have arrived).
        ``previous_owner_gone``: the previous owner's process was proven gone (True), or
        it was only presumed gone, its lease lapsed (False; None in histories written
        before this was recorded): a presumed-gone owner may be paused with a send that
        still lands, so no later "not arrived" answer can strike its sends off (ADR 0050).
        ``recovery_attempt``: the recovery attempts spent with this one (the decision the
        policy caps; a claim that took an unsent claim's place has its number, ADR 0070).
        ``records_send``: the claimer records ``RecoverySendStarted`` before it sends, so
        until that follows, this claim reached no platform (None: not said, as False)."""

        by: OwnerIdentity
        previous_owner: OwnerIdentity
        recovery_attempt: int
        needs_marker: bool
        fence: int
        previous_owner_gone: bool | None = None
        records_send: bool | None = None

        marker_decision = "needs_marker"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            return SendFact.STARTED

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.state = ObligationState.CLAIMED
            obligation.owner = self.by
            obligation.recovery_attempts = self.recovery_attempt
            obligation.fence = self.fence
            obligation.marker = self.marker_after(obligation.marker)
            obligation.stray_send_possible = obligation.stray_send_possible or not bool(
                self.previous_owner_gone
            )
            obligation.claim_unsent = bool(self.records_send)
            obligation.last_transition_at = self.timestamp

    class RecoverySendStarted(Event):
        """Its claimer, which claimed it with ``records_send``, starts to send it: only now
        does that claim spend its recovery attempt (ADR 0070). Recorded after every wait
        for order and rate budget, before the hand-off to the platform. It says nothing
        new of arrivals: the claim already counted as a send for the marker."""

        by: OwnerIdentity
        fence: int

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.claim_unsent = False

    class Waited(Event):
        """Its send waited ``seconds``, and why (a :class:`WaitReason`): behind an earlier
        reply to the same chat, for the rate budget, or out a pause the platform asked
        for (ADR 0065). A fact for the history and the pacing figures: it changes no
        state a send depends on."""

        by: OwnerIdentity
        reason: str
        seconds: float

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.paced_seconds += self.seconds

    class OrderReleased(Event):
        """It went to its chat before ``behind``, an earlier reply to the same chat that
        was still unresolved: order was given up, and why (an :class:`OrderRelease`),
        after ``waited`` seconds (ADR 0065). Recorded before the send it allows, so no
        reply ever overtakes another without a trace."""

        by: OwnerIdentity
        behind: str
        reason: str
        waited: float

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.released_behind.append(self.behind)

    class RetryRequested(Event):
        by: OwnerIdentity
        previous_owner: OwnerIdentity
        requested_by: str
        fence: int

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.owed_again(by=self.by, fence=self.fence, at=self.timestamp)

    class DeadLetterRetried(Event):
        """An operator sends a dead letter (abandoned, readable) again, on the record: it is
        owed once more, the operator its owner (the last owner fenced out), the recovery
        budget fresh, the marker kept. It carries the row facts the sweep's view lost
        when the obligation was abandoned (its id, platform and recording time)."""

        by: OwnerIdentity
        previous_owner: OwnerIdentity
        requested_by: str
        fence: int
        obligation_id: str
        platform: str
        recorded_at: datetime

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.owed_again(by=self.by, fence=self.fence, at=self.timestamp)
            obligation.abandon_reason = None

    class Abandoned(Event):
        """Given up on: a dead letter. Version 2 (0.2.0) carries ``error_class``, the class
        of the last failed send when it was abandoned (None: none failed), an audit fact
        a dead letter keeps after its retention; version 1 events are upcast with None,
        since it was not recorded then (ADR 0055)."""

        class_version = 2
        reason: str
        detail: str
        by: OwnerIdentity | None
        error_class: str | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["error_class"] = None

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.state = ObligationState.ABANDONED
            obligation.abandon_reason = AbandonReason(self.reason)
            obligation.last_transition_at = self.timestamp

    class Quarantined(Event):
        by: OwnerIdentity
        previous_owner: OwnerIdentity
        reason: str
        found_at: int
        fence: int

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.quarantine_reason = QuarantineReason(self.reason)
            obligation.owner = self.by
            obligation.fence = self.fence
            obligation.last_transition_at = self.timestamp

    class Reconciled(Event):
        """The owner asked the platform what arrived before repeating an uncertain send
        (ADR 0050). ``outcome``: arrived, not_arrived or unknown; ``evidence``: what the
        platform's answer rests on (its words, no personal data); ``message_ids``: the
        platform's ids when it arrived; ``part``: the part asked about (None: the whole
        reply); ``completes``: an arrival that leaves nothing to send (``Delivered``
        follows); ``claim_pending``: asked by a claimer before its claim's send;
        ``stray_send_possible``: a previous owner was only presumed gone, so a send of its
        may still land after the answer, which then proves nothing of it;
        ``may_have_arrived``: the marker's decision after it."""

        by: OwnerIdentity
        fence: int
        outcome: str
        evidence: str
        message_ids: list[str]
        part: int | None
        completes: bool
        claim_pending: bool
        may_have_arrived: bool
        stray_send_possible: bool = False

        marker_decision = "may_have_arrived"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            outcome = ReconcileOutcome(fields["outcome"])
            nothing = outcome is ReconcileOutcome.NOT_ARRIVED or (
                outcome is ReconcileOutcome.ARRIVED and not fields["completes"]
            )
            return SendFact.reconciliation(
                nothing_unconfirmed_arrived=nothing,
                claim_pending=bool(fields["claim_pending"]),
                stray_send_possible=bool(fields.get("stray_send_possible", False)),
            )

        def apply(self, obligation: DeliveryObligation) -> None:
            if self.outcome == ReconcileOutcome.ARRIVED and self.part is not None:
                obligation.delivered_parts[str(self.part)] = list(self.message_ids)
            obligation.marker = self.marker_after(obligation.marker)
            obligation.last_transition_at = self.timestamp

    class StatusReported(Event):
        """A status the platform reported after it accepted the delivered send (ADR 0050):
        ``delivered_to_device``, ``read``, or ``failed_after_acceptance``, which reopens
        the obligation (``Failed``-like: the usual retry rules apply). ``reported_at``:
        the platform's time; ``may_have_arrived``: the marker's decision after it. The
        owner, platform, record time and recovery claims are carried so that a view the
        delivered obligation had left takes a reopened one back without a reload."""

        by: OwnerIdentity | None
        status: str
        detail: str
        reported_at: datetime
        may_have_arrived: bool
        obligation_id: str
        owner: OwnerIdentity
        platform: str
        recorded_at: datetime
        recovery_attempts: int
        part: int | None = None
        """The part of a multi-part reply whose message failed, when an earlier one than
        the last: it alone is sent again (the last is kept as confirmed)."""
        message_id: str | None = None
        """The platform's id of the message the status is about (None: not said)."""

        marker_decision = "may_have_arrived"

        @classmethod
        def send_fact(cls, fields: Mapping[str, Any]) -> SendFact | None:
            failed = PlatformStatus(fields["status"]) is PlatformStatus.FAILED_AFTER_ACCEPTANCE
            return SendFact.REFUSED if failed else None

        def apply(self, obligation: DeliveryObligation) -> None:
            status = PlatformStatus(self.status)
            obligation.platform_status = status
            obligation.status_message_id = self.message_id
            if self.part is not None:
                parts = obligation.delivered_parts
                if obligation.state is ObligationState.DELIVERED:
                    earlier = {i for ids in parts.values() for i in ids}
                    for index in range(obligation.part_count):
                        if str(index) not in parts:  # the last part, confirmed by Delivered
                            parts[str(index)] = [i for i in obligation.receipt if i not in earlier]
                del parts[str(self.part)]
            if status is PlatformStatus.FAILED_AFTER_ACCEPTANCE:
                obligation.failures_after_acceptance += 1
                obligation.state = ObligationState.FAILED
                obligation.last_error = self.detail or status.value
                obligation.error_class = ErrorClass.REJECTED
                obligation.retry_after = None
                obligation.marker = self.marker_after(obligation.marker)
            obligation.last_transition_at = self.timestamp

    class Imported(Event):
        """The obligation was brought from another installation's ledger (``source``):
        what its row said (``source_state``, ``attempts``, ``last_error``) and when
        (``created_at``/``updated_at``, epoch seconds, ``time_basis`` naming how they were
        read). A fact, not a transition: the events after it carry the state the row told,
        and ``possibly_sent`` whether a send may have reached the user before the import."""

        source: str
        source_state: str
        attempts: int
        last_error: str
        created_at: float
        updated_at: float
        time_basis: str
        possibly_sent: bool

        def apply(self, obligation: DeliveryObligation) -> None:
            obligation.last_transition_at = self.timestamp

    def owed_again(self, *, by: OwnerIdentity, fence: int, at: datetime) -> None:
        """What an operator's retry does to the state (``RetryRequested``,
        ``DeadLetterRetried``): owed again, the operator its owner, a fresh recovery budget.
        Called only from those events' ``apply``."""
        self.state = ObligationState.PENDING
        self.owner = by
        self.fence = fence
        self.recovery_attempts = 0
        self.claim_unsent = False
        self.retry_after = None
        self.last_transition_at = at

    # -- creation ---------------------------------------------------------------------------

    def __init__(self) -> None:
        """Every attribute is set by the ``Recorded`` event (see ``record``)."""

    def trigger_event(self, event_class: type[Any], **kwargs: Any) -> None:
        """The library's ``trigger_event`` for this aggregate's commands, without what
        they never need: each names one explicit event class (no topic to check) and is
        handed ``now`` as ``timestamp`` (the domain has no clock), and the event is built
        as the next in this aggregate's sequence, so it is applied without ``mutate``'s
        two checks of that (which stay for every event read from the store)."""
        event = event_class(originator_id=self.id, originator_version=self.version + 1, **kwargs)
        event.apply(self)
        self.version = event.originator_version
        self.modified_on = event.timestamp
        self.pending_events.append(event)

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
        require_content("content", content)
        if not isinstance(owner, OwnerIdentity):
            raise InvalidInput("owner must be an OwnerIdentity")
        require_aware("now", now)
        if type(parts) not in KNOWN_LISTS and (
            isinstance(parts, str | bytes) or not isinstance(parts, Sequence)
        ):
            raise InvalidInput(f"parts must be a sequence of str, not {type(parts).__name__}")
        part_list = [require_text(f"parts[{i}]", p, allow_empty=True) for i, p in enumerate(parts)]
        if part_list and "".join(part_list) != content:
            raise InvalidInput("parts must be the content split in order, nothing added or lost")
        if not is_item_list(media):
            raise InvalidInput(f"media must be a list of MediaItem, not {type(media).__name__}")
        media_list = list(media)
        for item in media_list:
            if not isinstance(item, MediaItem):
                raise InvalidInput("media must hold MediaItem values")
        meta = require_metadata("metadata", metadata)
        # What the library's ``_create`` does for this one creation event, without its
        # generic steps (keyword filtering for ``create_id``, the topic check, the copy of
        # every keyword); a test pins the result to ``_create``'s. The library makes the
        # event classes dataclasses, which the type checker does not see.
        recorded: type[Any] = cls.Recorded
        event = recorded(
            originator_topic=get_topic(cls),
            originator_id=cls.create_id(obligation_id),
            originator_version=cls.INITIAL_VERSION,
            timestamp=now,
            obligation_id=obligation_id,
            session_key=session_key,
            target=target,
            content=content,
            parts=part_list,
            media=media_list,
            metadata=meta,
            owner=owner,
        )
        obligation: DeliveryObligation = event.mutate(None)
        obligation.pending_events.append(event)
        return obligation

    # -- derived facts ----------------------------------------------------------------------

    @property
    def may_have_arrived(self) -> bool:
        """Some send may have reached the user: the next send goes out with the marker."""
        return self.marker.may_have_arrived

    @property
    def needs_marker(self) -> bool:
        """True when a previous send may have reached the user, so a re-send may duplicate."""
        return self.marker.may_have_arrived

    @property
    def arrived_before_this_send(self) -> bool:
        """Whether the send in flight needed the marker, as its ``Attempting`` or
        ``Claimed`` recorded (a late success since counts too)."""
        return self.marker.arrived_before_this_send

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

    @property
    def is_quarantined(self) -> bool:
        return self.quarantine_reason is not None

    def is_fenced_out(self, by: OwnerIdentity, fence: int | None = None) -> bool:
        """True when ``by`` lost the obligation to a later claim (ADR 0010).

        With the reporter's fence: it is older than the current one. Without: after a claim
        (fence > 0) only the current owner speaks for the obligation.
        """
        if fence is not None:
            return _fence(fence) < self.fence
        return self.fence > 0 and by != self.owner

    # -- guards: each refuses one transition by name, before any event exists -----------------

    def _refuse(self, transition: str, why: str = "") -> IllegalTransition:
        return IllegalTransition(
            "DeliveryObligation", self.obligation_id, self.state.value, transition, why
        )

    def check_freshly_recorded(self, transition: str) -> None:
        """Only an obligation that has just been recorded (its first event) may take it."""
        if self.version != 1:
            raise self._refuse(transition, "only a freshly recorded obligation")

    def check_state(self, transition: str, *allowed: ObligationState) -> None:
        """The transition is one the current state allows."""
        if self.state not in allowed:
            raise self._refuse(transition)

    def check_not_quarantined(self, transition: str) -> None:
        """Nothing unreadable is ever sent: a quarantined obligation is never sent again."""
        if self.quarantine_reason is not None:
            raise self._refuse(transition, f"quarantined ({self.quarantine_reason.value})")

    def check_sender(self, by: OwnerIdentity) -> None:
        """After a claim only the claimer may start a send (fencing, ADR 0010)."""
        if self.fence > 0 and by != self.owner:
            raise self._refuse("attempting", f"claimed by {self.owner.describe()}; fenced out")

    def check_claim_unsent(self) -> None:
        """A recovery send starts once per claim, and only after a claim whose claimer
        records its sends (``Claimed.records_send``)."""
        if not self.claim_unsent:
            raise self._refuse(
                "recovery send started", "no claim that records its send is waiting to send"
            )

    def check_holder(self, transition: str, by: OwnerIdentity) -> None:
        """Only its owner, who is sending it, says how its send was paced."""
        if by != self.owner:
            raise self._refuse(transition, f"owned by {self.owner.describe()}")

    def check_part_index(self, index: object) -> None:
        """A part is named by its index in this reply (text chunks, then media items)."""
        if not isinstance(index, int) or isinstance(index, bool):
            raise InvalidInput("part index must be an int")
        if not 0 <= index < self.part_count:
            raise InvalidInput(f"part index {index} is outside 0..{self.part_count - 1}")

    def check_part_unconfirmed(self, index: int) -> None:
        """A part is confirmed once."""
        if self.part_delivered(index):
            raise self._refuse(f"part {index} delivered", "that part is already confirmed")

    def check_claimer(self, by: OwnerIdentity, policy: LedgerPolicy) -> None:
        """A process never claims its own obligation, and claims stop at the policy's cap."""
        if by == self.owner:
            raise self._refuse("claimed", "a process never claims its own obligation")
        if self.recovery_spent(policy):
            raise self._refuse("claimed", f"{self.recovery_attempts} recovery claims already")

    def recovery_spent(self, policy: LedgerPolicy) -> bool:
        """Its recovery attempts reached the policy's cap: no more claims, the sweep
        abandons it (``max_attempts``). A last claim that reached no platform (its
        claimer recorded no send of it) is not spent: the next claim takes its place, so
        gateways killed while a reply waited for its turn never use up its budget (ADR
        0070)."""
        return self.recovery_attempts >= policy.max_attempts and not self.claim_unsent

    def next_recovery_attempt(self) -> int:
        """The recovery attempt a claim now spends: one more, or the number of an unsent
        last claim, whose place it takes (ADR 0070)."""
        return self.recovery_attempts if self.claim_unsent else self.recovery_attempts + 1

    # -- commands ---------------------------------------------------------------------------

    def start_attempt(
        self, *, by: OwnerIdentity, now: datetime, guard: SendGuard | str | None = None
    ) -> None:
        """The holder starts a send. After a claim, only the claimer may (fencing).

        ``guard`` is what the sender does against an unannounced duplicate (ADR 0026):
        recorded so that the audit reads it instead of inferring it. None: not said.
        """
        require_aware("now", now)
        # ``str()`` of a StrEnum member is its value, without the ``value`` property's calls.
        said = None if guard is None else str(require_choice("send guard", guard, SendGuard))
        self.check_state("attempting", ObligationState.PENDING, ObligationState.FAILED)
        self.check_not_quarantined("attempting")
        self.check_sender(by)
        after = marker_after(self.marker, SendFact.STARTED)
        self.trigger_event(
            self.Attempting,
            by=by,
            fence=self.fence,
            guard=said,
            needs_marker=after.arrived_before_this_send,
            timestamp=now,
        )

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
        self.check_state("delivered", ObligationState.ATTEMPTING, ObligationState.CLAIMED)
        self.trigger_event(self.Delivered, by=by, receipt=ids, fence=self.fence, timestamp=now)

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
        self.check_part_index(index)
        if self.is_fenced_out(by, fence):
            ids = receipt_ids(receipt)
            self._report_late(by, now, fence, "part_delivered", receipt=ids, part=index)
            return
        self.check_state(
            f"part {index} delivered", ObligationState.ATTEMPTING, ObligationState.CLAIMED
        )
        self.check_part_unconfirmed(index)
        ids = receipt_ids(receipt)
        self.trigger_event(
            self.PartDelivered, by=by, index=index, receipt=ids, fence=self.fence, timestamp=now
        )

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
        judged = require_choice("error classification", classification, ErrorClass)
        seconds = _retry_after(retry_after)
        text = cut_error(error)
        if self.is_fenced_out(by, fence):
            self._report_late(by, now, fence, "failed", error=text, classification=judged.value)
            return
        self.check_state("failed", ObligationState.ATTEMPTING, ObligationState.CLAIMED)
        after = marker_after(self.marker, SendFact.failure(judged))
        self.trigger_event(
            self.Failed,
            by=by,
            error=text,
            classification=judged.value,
            retry_after=seconds,
            fence=self.fence,
            may_have_arrived=after.may_have_arrived,
            timestamp=now,
        )

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
        """A fenced-out owner's result: recorded as a fact, never as a transition."""
        after = marker_after(self.marker, SendFact.late_result(outcome))
        self.trigger_event(
            self.LateResultReported,
            by=by,
            outcome=outcome,
            receipt=list(receipt),
            error=error,
            classification=classification,
            part=part,
            fence=fence,
            current_fence=self.fence,
            late=True,
            may_have_arrived=after.may_have_arrived,
            timestamp=now,
        )

    def claim(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        policy: LedgerPolicy,
        previous_owner_gone: bool = False,
        records_send: bool = False,
    ) -> None:
        """A recovery sweep takes the obligation over from a dead owner:
        ``previous_owner_gone`` when its process is proven gone, not only its lease lapsed;
        ``records_send`` when the claimer records ``RecoverySendStarted`` before it sends
        (the gateway does; a caller of the upstream API sends straight after the claim)."""
        require_aware("now", now)
        self.check_state("claimed", *UNRESOLVED_STATES)
        self.check_not_quarantined("claimed")
        self.check_claimer(by, policy)
        after = marker_after(self.marker, SendFact.STARTED)
        self.trigger_event(
            self.Claimed,
            by=by,
            previous_owner=self.owner,
            recovery_attempt=self.next_recovery_attempt(),
            needs_marker=after.arrived_before_this_send,
            fence=self.fence + 1,
            previous_owner_gone=bool(previous_owner_gone),
            records_send=bool(records_send),
            timestamp=now,
        )

    def check_reconciler(self, by: OwnerIdentity) -> None:
        """Only the owner asks the platform before its own re-send (fencing, ADR 0073)."""
        if by != self.owner:
            raise self._refuse("reconciled", f"owned by {self.owner.describe()}; fenced out")

    def check_arrival_ids(self, outcome: ReconcileOutcome, ids: Sequence[str]) -> None:
        """An arrival names the platform's message ids; no other answer has any."""
        if outcome is ReconcileOutcome.ARRIVED and not ids:
            raise InvalidInput("an arrived reconciliation names the platform's message ids")
        if outcome is not ReconcileOutcome.ARRIVED and ids:
            raise InvalidInput(f"a {outcome.value} reconciliation has no message ids")

    def reconcile(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        outcome: ReconcileOutcome | str,
        evidence: str = "",
        message_ids: Sequence[str | int] = (),
        part: int | None = None,
    ) -> None:
        """Record what the platform answered before an uncertain send is repeated (ADR 0050).

        ``arrived`` of the part asked about (``part``; None: the whole reply) records its
        receipt; when nothing is left to send the obligation is settled ``Delivered`` in
        the same step. ``not_arrived`` strikes off every earlier send, so the re-send goes
        without the marker; ``unknown`` changes nothing but the history.
        """
        require_aware("now", now)
        judged = require_choice("reconciliation outcome", outcome, ReconcileOutcome)
        if not isinstance(evidence, str):
            raise InvalidInput("evidence must be a str")
        ids = receipt_ids(message_ids)
        self.check_arrival_ids(judged, ids)
        if part is not None:
            self.check_part_index(part)
            self.check_part_unconfirmed(part)
        self.check_state(
            "reconciled", ObligationState.PENDING, ObligationState.FAILED, ObligationState.CLAIMED
        )
        self.check_not_quarantined("reconciled")
        self.check_reconciler(by)
        arrived = judged is ReconcileOutcome.ARRIVED
        left = [i for i in range(self.part_count) if not self.part_delivered(i) and i != part]
        completes = arrived and (part is None or not left)
        claim_pending = self.state is ObligationState.CLAIMED
        fact = SendFact.reconciliation(
            nothing_unconfirmed_arrived=judged is ReconcileOutcome.NOT_ARRIVED
            or (arrived and not completes),
            claim_pending=claim_pending,
            stray_send_possible=self.stray_send_possible,
        )
        after = marker_after(self.marker, fact)
        self.trigger_event(
            self.Reconciled,
            by=by,
            fence=self.fence,
            outcome=judged.value,
            evidence=cut_error(evidence),
            message_ids=ids,
            part=part,
            completes=completes,
            claim_pending=claim_pending,
            may_have_arrived=after.may_have_arrived,
            stray_send_possible=self.stray_send_possible,
            timestamp=now,
        )
        if completes:
            receipt = [i for ids_ in self.delivered_parts.values() for i in ids_]
            receipt += [] if part is not None else ids
            self.trigger_event(
                self.Delivered, by=by, receipt=receipt, fence=self.fence, timestamp=now
            )

    def reopened_with_part_confirmed(self, message_id: str | None) -> bool:
        """Reopened by a failure after acceptance, and ``message_id`` is another part's
        still confirmed: the platform dropped that part too, and its re-send is owed."""
        return (
            message_id is not None
            and self.state is ObligationState.FAILED
            and self.platform_status is PlatformStatus.FAILED_AFTER_ACCEPTANCE
            and any(message_id in ids for ids in self.delivered_parts.values())
        )

    def report_status(
        self,
        *,
        status: PlatformStatus | str,
        at: datetime,
        now: datetime,
        detail: str = "",
        by: OwnerIdentity | None = None,
        message_id: str | None = None,
    ) -> bool:
        """Record a status the platform reported after it accepted the send (ADR 0050).

        Statuses only move forward (accepted, delivered to the device, read); one that
        does not (a late or repeated callback), or one about a message that is not the
        delivered send's (``message_id`` not in its receipt: an earlier send's), changes
        nothing and returns False.
        ``failed_after_acceptance``, possible only before any other status, reopens the
        obligation for a re-send under the usual rules, without the marker unless an
        earlier send may have arrived.
        """
        require_aware("now", now)
        require_aware("at", at)
        judged = require_choice("platform status", status, PlatformStatus)
        if not isinstance(detail, str):
            raise InvalidInput("detail must be a str")
        failed = judged is PlatformStatus.FAILED_AFTER_ACCEPTANCE
        mid = None if message_id is None else str(message_id)
        if self.state is not ObligationState.DELIVERED:
            if failed and self.platform_status is judged and mid in (None, self.status_message_id):
                return False  # the failure that reopened it, repeated
            if not (failed and self.reopened_with_part_confirmed(mid)):
                # Not delivered yet (its Delivered not written) or reopened: refused, by name.
                self.check_state(f"status {judged.value}", ObligationState.DELIVERED)
        if mid is not None and mid not in self.receipt:
            return False  # about an earlier send's message
        current = ACCEPTED_RANK if self.platform_status is None else self.platform_status.rank
        another_failure = failed and mid is not None and mid != self.status_message_id
        if self.platform_status is not None and judged.rank <= current and not another_failure:
            return False  # repeated or behind: changes nothing
        part = None
        if judged is PlatformStatus.FAILED_AFTER_ACCEPTANCE and message_id is not None:
            part = next(
                (int(i) for i, ids in self.delivered_parts.items() if str(message_id) in ids),
                None,
            )
        after = marker_after(self.marker, self.StatusReported.send_fact({"status": judged.value}))
        self.trigger_event(
            self.StatusReported,
            by=by,
            status=judged.value,
            detail=cut_error(detail),
            reported_at=at,
            may_have_arrived=after.may_have_arrived,
            obligation_id=self.obligation_id,
            owner=self.owner,
            platform=self.target.platform,
            recorded_at=self.recorded_at,
            recovery_attempts=self.recovery_attempts,
            part=part,
            message_id=mid,
            timestamp=now,
        )
        return True

    def start_recovery_send(self, *, by: OwnerIdentity, now: datetime) -> None:
        """The claimer starts sending what it claimed with ``records_send``: the claim now
        spends its recovery attempt (ADR 0070). Before this, a claimer that died spent
        nothing: the next claim takes its place."""
        require_aware("now", now)
        self.check_state("recovery send started", ObligationState.CLAIMED)
        self.check_not_quarantined("recovery send started")
        self.check_holder("recovery send started", by)
        self.check_claim_unsent()
        self.trigger_event(self.RecoverySendStarted, by=by, fence=self.fence, timestamp=now)

    def note_wait(
        self, *, by: OwnerIdentity, now: datetime, reason: WaitReason | str, seconds: float
    ) -> None:
        """Its owner held its send back for ``seconds`` (order, rate budget, a pause)."""
        require_aware("now", now)
        said = require_choice("wait reason", reason, WaitReason)
        seconds = require_wait("seconds", seconds)
        self.check_state("waited", *UNRESOLVED_STATES)
        self.check_holder("waited", by)
        self.trigger_event(self.Waited, by=by, reason=said.value, seconds=seconds, timestamp=now)

    def release_order(
        self,
        *,
        by: OwnerIdentity,
        now: datetime,
        behind: str,
        reason: OrderRelease | str,
        waited: float,
    ) -> None:
        """Its owner sends it before ``behind``, an earlier unresolved reply to its chat."""
        require_aware("now", now)
        behind = require_obligation_id(behind)
        said = require_choice("order release reason", reason, OrderRelease)
        waited = require_wait("waited", waited)
        self.check_state("order released", *UNRESOLVED_STATES)
        self.check_holder("order released", by)
        if behind == self.obligation_id:
            raise self._refuse("order released", "a reply is never behind itself")
        self.trigger_event(
            self.OrderReleased,
            by=by,
            behind=behind,
            reason=said.value,
            waited=waited,
            timestamp=now,
        )

    def request_retry(self, *, by: OwnerIdentity, now: datetime, requested_by: str = "") -> None:
        """An operator asks for another try: any gateway's next sweep may claim it at once.

        The operator becomes the owner (so the previous owner is fenced out and the sweep
        never asks whether it is alive), the recovery budget starts again, and the marker
        is kept: a re-send after a send that may have arrived is still labelled.
        """
        require_aware("now", now)
        self.check_state("retry requested", *UNRESOLVED_STATES)
        self.check_not_quarantined("retry requested")
        require_clear_text("requested_by", requested_by, allow_empty=True)
        self.trigger_event(
            self.RetryRequested,
            by=by,
            previous_owner=self.owner,
            requested_by=requested_by,
            fence=self.fence + 1,
            timestamp=now,
        )

    def retry_dead_letter(self, *, by: OwnerIdentity, now: datetime, requested_by: str) -> None:
        """An operator retries an abandoned reply: owed again, the next sweep sends it
        (labelled if an earlier send may have arrived). Who asked is required."""
        require_aware("now", now)
        self.check_state("dead letter retried", ObligationState.ABANDONED)
        self.check_not_quarantined("dead letter retried")
        requested_by = require_clear_text("requested_by", requested_by)
        self.trigger_event(
            self.DeadLetterRetried,
            by=by,
            previous_owner=self.owner,
            requested_by=requested_by,
            fence=self.fence + 1,
            obligation_id=self.obligation_id,
            platform=self.target.platform,
            recorded_at=self.recorded_at,
            timestamp=now,
        )

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
        self.check_state(f"abandoned ({reason.value})", *UNRESOLVED_STATES)
        if reason is AbandonReason.OPERATOR:
            detail = _operator_reason(detail)
        elif not isinstance(detail, str):
            raise InvalidInput("detail must be a str")
        else:
            detail = cut_error(detail)  # a platform's or a sweep's words: kept, never refused
        self.trigger_event(
            self.Abandoned,
            reason=reason.value,
            detail=detail,
            by=by,
            error_class=None if self.error_class is None else self.error_class.value,
            timestamp=now,
        )

    def note_import(
        self,
        *,
        source: str,
        source_state: str,
        attempts: int,
        last_error: str,
        created_at: float,
        updated_at: float,
        time_basis: str,
        now: datetime,
    ) -> None:
        """Record what an imported row said, right after its ``Recorded`` event (nothing
        else has happened to the obligation here yet). A row with a state other than
        ``pending``, or with attempts, may have been sent: upstream's claims never change
        the state (hermes-formats.md §4)."""
        require_aware("now", now)
        require_clear_text("source", source)
        self.check_freshly_recorded("imported")
        if not isinstance(last_error, str):
            raise InvalidInput("last_error must be a str")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise InvalidInput("attempts must be a non-negative int")
        for name, stamp in (("created_at", created_at), ("updated_at", updated_at)):
            if not isinstance(stamp, int | float) or not math.isfinite(stamp):
                raise InvalidInput(f"{name} must be a finite epoch time")
        self.trigger_event(
            self.Imported,
            source=source,
            source_state=require_clear_text("source_state", source_state),
            attempts=attempts,
            last_error=cut_error(last_error),
            created_at=float(created_at),
            updated_at=float(updated_at),
            time_basis=require_clear_text("time_basis", time_basis),
            possibly_sent=source_state != ObligationState.PENDING.value or attempts > 0,
            timestamp=now,
        )

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
        self.check_state("quarantined", *UNRESOLVED_STATES)
        self.check_not_quarantined("quarantined")
        self.trigger_event(
            self.Quarantined,
            by=by,
            previous_owner=self.owner,
            reason=reason.value,
            found_at=found_at,
            fence=self.fence + 1,
            timestamp=now,
        )
