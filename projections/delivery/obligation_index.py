"""ObligationIndex: one row per obligation, for operators' status, list and metrics.

Unlike the recoverable view, resolved obligations stay (with when they were delivered
or why they were abandoned), so ``status`` and ``list`` read this index and never replay
history. A row holds no personal data: the session appears only as its keyed subject id
(the same name the privacy keyring uses), never as the session key or chat id.

The marker columns hold what the aggregate holds (ADR 0006): each event's recorded
decision, or for an event written before events recorded it, what the one rule
(``domain/delivery/marker.py``) derives from the marker before it; the index never
restates the rule.
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import attrs

from gateway_ledger.domain.delivery.marker import NOTHING_SENT, Marker, SendFact, marker_after
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.delivery.reconciliation import PlatformStatus
from gateway_ledger.domain.values import (
    UNRESOLVED_STATES,
    ErrorClass,
    ObligationState,
    OwnerIdentity,
)
from gateway_ledger.projections.delivery.obligation_view import (
    ObligationProjection,
    from_micros,
    to_micros,
)
from gateway_ledger.projections.rows import (
    NO_RELATIVE,
    Add,
    Case,
    Insert,
    Previous,
    Relative,
    RowChange,
    Update,
    Value,
)
from gateway_ledger.projections.view import MaterializedView

INDEX_NAME = "obligation_index"

UNRESOLVED: tuple[str, ...] = tuple(sorted(s.value for s in UNRESOLVED_STATES))
"""The states of an obligation still owed (quarantined ones are counted apart)."""


@attrs.frozen
class IndexEntry:
    """One obligation as operators see it: facts, no personal data."""

    obligation_id: str
    state: str
    platform: str
    subject_id: str
    owner_host: str
    owner_pid: int
    recorded_at: datetime
    last_transition_at: datetime
    delivered_at: datetime | None
    send_attempts: int
    claims: int
    recovery_attempts: int
    retries: int
    fence: int
    needs_marker: bool
    error_class: str | None
    abandon_reason: str | None
    version: int
    quarantine_reason: str | None = None
    quarantine_version: int | None = None
    platform_status: str | None = None
    """The last status the platform reported after accepting it (ADR 0050)."""
    failed_after_acceptance: int = 0
    """Times the platform dropped it after accepting it (each reopened it)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> IndexEntry:
        delivered = row["delivered_at"]
        return cls(
            obligation_id=row["obligation_id"],
            state=row["state"],
            platform=row["platform"],
            subject_id=row["subject_id"],
            owner_host=row["owner_host"],
            owner_pid=int(row["owner_pid"]),
            recorded_at=from_micros(row["recorded_at"]),
            last_transition_at=from_micros(row["last_transition_at"]),
            delivered_at=None if delivered is None else from_micros(delivered),
            send_attempts=int(row["send_attempts"]),
            claims=int(row["claims"]),
            recovery_attempts=int(row["recovery_attempts"]),
            retries=int(row["retries"]),
            fence=int(row["fence"]),
            needs_marker=bool(row["may_have_arrived"]),
            error_class=row["error_class"],
            abandon_reason=row["abandon_reason"],
            version=int(row["version"]),
            quarantine_reason=row["quarantine_reason"],
            quarantine_version=(
                None if row["quarantine_version"] is None else int(row["quarantine_version"])
            ),
            platform_status=row["platform_status"],
            failed_after_acceptance=int(row["failed_after_acceptance"] or 0),
        )

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for name in ("recorded_at", "last_transition_at", "delivered_at"):
            value = data[name]
            data[name] = None if value is None else value.isoformat()
        return data


class SubjectNames(Protocol):
    """Names the session of a recorded reply by its keyed subject id, never in clear."""

    def subject_of(self, event: DeliveryObligation.Recorded) -> str:
        """The subject id ('' when the store keys no subjects)."""


def owner_values(owner: OwnerIdentity) -> dict[str, Value]:
    """The owner columns operators read: where it runs, not the whole identity."""
    return {"owner_host": owner.host, "owner_pid": owner.pid}


_ONE_MORE_SEND: Mapping[str, Relative] = {"send_attempts": Add(1)}
_ONE_MORE_CLAIM: Mapping[str, Relative] = {"claims": Add(1)}
_ONE_MORE_RETRY: Mapping[str, Relative] = {"retries": Add(1)}
_ONE_MORE_FAILURE_AFTER_ACCEPTANCE: Mapping[str, Relative] = {"failed_after_acceptance": Add(1)}

MARKER_COLUMNS = ("may_have_arrived", "arrived_before")
"""The index's copy of the aggregate's duplicate marker (``domain/delivery/marker.py``),
as 0 or 1 each, in the order of :class:`~gateway_ledger.domain.delivery.marker.Marker`."""

_MARKERS = tuple(itertools.product((0, 1), repeat=len(MARKER_COLUMNS)))
_NOTHING_SENT = dict(zip(MARKER_COLUMNS, map(int, NOTHING_SENT), strict=True))
"""The marker columns of a reply just recorded."""


@attrs.frozen
class MarkerChange:
    """What one kind of event does to the marker columns: new values, and values that
    depend on the marker the row held before (written without reading the row)."""

    values: Mapping[str, int]
    relative: Mapping[str, Relative]


NO_MARKER_CHANGE = MarkerChange({}, NO_RELATIVE)


def marker_change(fact: SendFact, recorded: bool | None) -> MarkerChange:
    """The marker columns after an event stating ``fact`` with the decision ``recorded``
    (None: an event written before events carried it), for each marker the row may hold
    before it, by the one rule: :func:`~gateway_ledger.domain.delivery.marker.marker_after`.

    A column the rule sets alike for every earlier marker gets that value; one it copies
    from the earlier marker gets that column's old value; anything else a ``CASE``.
    """
    after = {m: marker_after(Marker(*map(bool, m)), fact, recorded) for m in _MARKERS}
    values: dict[str, int] = {}
    relative: dict[str, Relative] = {}
    for i, column in enumerate(MARKER_COLUMNS):
        results = {m: int(after[m][i]) for m in _MARKERS}
        copied = [
            j for j in range(len(MARKER_COLUMNS)) if all(results[m] == m[j] for m in _MARKERS)
        ]
        if len(set(results.values())) == 1:
            values[column] = results[_MARKERS[0]]
        elif i in copied:
            continue  # the column keeps its value
        elif copied:
            relative[column] = Previous(MARKER_COLUMNS[copied[0]])
        else:
            relative[column] = Case(MARKER_COLUMNS, tuple(results.items()))
    return MarkerChange(values, relative)


class IndexProjection(ObligationProjection):
    """One row per obligation, for status, listing and metrics without replaying history."""

    placeholders = {
        "platform": "",
        "subject_id": "",
        "owner_host": "",
        "owner_pid": 0,
        "recorded_at": 0,
        "last_transition_at": 0,
        "send_attempts": 0,
        "claims": 0,
        "recovery_attempts": 0,
        "retries": 0,
        "fence": 0,
        "failed_after_acceptance": 0,
        **_NOTHING_SENT,
    }

    def __init__(self, subjects: SubjectNames, name: str = INDEX_NAME) -> None:
        super().__init__(name)
        self.subjects = subjects
        self._markers: dict[tuple[SendFact, bool | None], MarkerChange] = {}

    def marker(self, event: DeliveryObligation.Event) -> MarkerChange:
        """What ``event`` does to the marker columns: the decision it records (or, for an
        event written before it recorded one, the rule's derivation; ADR 0006)."""
        cls = type(event)
        fields = vars(event)
        fact = cls.send_fact(fields)
        if fact is None:
            return NO_MARKER_CHANGE
        key = (fact, fields.get(cls.marker_decision))
        found = self._markers.get(key)
        if found is None:
            found = self._markers[key] = marker_change(*key)
        return found

    def update(
        self,
        event: DeliveryObligation.Event,
        values: dict[str, Value],
        relative: Mapping[str, Relative] = NO_RELATIVE,
        *,
        moment: int | None = None,
    ) -> Update:
        """Every change of a row also takes what its event does to the marker."""
        marker = self.marker(event)
        if marker.values:
            values.update(marker.values)
        if marker.relative:
            relative = {**relative, **marker.relative}
        return super().update(event, values, relative, moment=moment)

    def recorded(self, event: DeliveryObligation.Recorded) -> RowChange:
        moment = to_micros(event.timestamp)
        return Insert(
            event.originator_id.hex,
            {
                "obligation_id": event.obligation_id,
                "state": ObligationState.PENDING.value,
                "platform": event.target.platform,
                "subject_id": self.subjects.subject_of(event),
                "owner_host": event.owner.host,
                "owner_pid": event.owner.pid,
                "recorded_at": moment,
                "last_transition_at": moment,
                "delivered_at": None,
                "send_attempts": 0,
                "claims": 0,
                "recovery_attempts": 0,
                "retries": 0,
                "fence": 0,
                **_NOTHING_SENT,
                "error_class": None,
                "abandon_reason": None,
                "version": event.originator_version,
                "quarantine_reason": None,
                "quarantine_version": None,
                "platform_status": None,
                "failed_after_acceptance": 0,
            },
        )

    def attempting(self, event: DeliveryObligation.Attempting) -> RowChange:
        values = owner_values(event.by)
        values["state"] = ObligationState.ATTEMPTING.value
        return self.update(event, values, _ONE_MORE_SEND)

    def claimed(self, event: DeliveryObligation.Claimed) -> RowChange:
        values = owner_values(event.by)
        values["state"] = ObligationState.CLAIMED.value
        values["recovery_attempts"] = event.recovery_attempt
        values["fence"] = event.fence
        return self.update(event, values, _ONE_MORE_CLAIM)

    def failed(self, event: DeliveryObligation.Failed) -> RowChange:
        values: dict[str, Value] = {
            "state": ObligationState.FAILED.value,
            "error_class": event.classification,
        }
        return self.update(event, values)

    def delivered(self, event: DeliveryObligation.Delivered) -> RowChange:
        moment = to_micros(event.timestamp)
        values: dict[str, Value] = {
            "state": ObligationState.DELIVERED.value,
            "delivered_at": moment,
            "platform_status": None,
        }
        return self.update(event, values, moment=moment)

    def abandoned(self, event: DeliveryObligation.Abandoned) -> RowChange:
        return self.update(
            event, {"state": ObligationState.ABANDONED.value, "abandon_reason": event.reason}
        )

    def retry_requested(self, event: DeliveryObligation.RetryRequested) -> RowChange:
        values = owner_values(event.by)
        values["state"] = ObligationState.PENDING.value
        values["recovery_attempts"] = 0
        values["fence"] = event.fence
        return self.update(event, values, _ONE_MORE_RETRY)

    def dead_letter_retried(self, event: DeliveryObligation.DeadLetterRetried) -> RowChange:
        """Owed again: no longer a dead letter, one more operator retry."""
        values = owner_values(event.by)
        values["state"] = ObligationState.PENDING.value
        values["recovery_attempts"] = 0
        values["fence"] = event.fence
        values["abandon_reason"] = None
        return self.update(event, values, _ONE_MORE_RETRY)

    def quarantined_fact(self, event: DeliveryObligation.Quarantined) -> RowChange:
        values = {**self.quarantined(event), **owner_values(event.by), "fence": event.fence}
        return self.update(event, values)

    def status_reported(self, event: DeliveryObligation.StatusReported) -> RowChange:
        """A failure after acceptance reopens the obligation (ADR 0050)."""
        values: dict[str, Value] = {"platform_status": event.status}
        if event.status != PlatformStatus.FAILED_AFTER_ACCEPTANCE:
            return self.update(event, values)
        values["state"] = ObligationState.FAILED.value
        values["error_class"] = ErrorClass.REJECTED.value
        values["delivered_at"] = None
        return self.update(event, values, _ONE_MORE_FAILURE_AFTER_ACCEPTANCE)

    handlers = {
        DeliveryObligation.Recorded: recorded,
        DeliveryObligation.Attempting: attempting,
        DeliveryObligation.Claimed: claimed,
        DeliveryObligation.Failed: failed,
        DeliveryObligation.Delivered: delivered,
        DeliveryObligation.Abandoned: abandoned,
        DeliveryObligation.RetryRequested: retry_requested,
        DeliveryObligation.DeadLetterRetried: dead_letter_retried,
        DeliveryObligation.Quarantined: quarantined_fact,
        DeliveryObligation.StatusReported: status_reported,
    }


# -- the questions operators ask of the index ------------------------------------------------


@attrs.frozen
class IndexQuery:
    """Which obligations to list (every condition given must hold), oldest first."""

    state: str | None = None
    platform: str | None = None
    platform_status: str | None = None
    recorded_since: datetime | None = None
    subject_id: str | None = None
    limit: int | None = None


@attrs.frozen
class GroupCount:
    """The obligations of one platform in one state, with their recovery figures."""

    platform: str
    state: str
    obligations: int
    claims: int
    """Recovery claims over all of them."""
    claimed: int
    """Those claimed at least once."""
    retries: int
    failed_after_acceptance: int = 0
    """Failures the platform reported after accepting a send (each reopened one)."""
    read: int = 0
    """Those the platform reported read."""
    delivered_to_device: int = 0
    """Those the platform reported on the device (not yet read)."""


@attrs.frozen
class DeliveryTally:
    """Record to delivery over every delivered obligation, counted by the store (a scrape
    or ``status`` reads no row per obligation)."""

    count: int
    total: float
    """Seconds, summed."""
    p50: float | None
    p95: float | None
    max: float | None
    """Nearest-rank percentiles and the maximum, in seconds (None: nothing delivered)."""
    cumulative: tuple[int, ...]
    """How many took at most each bound asked for, then all of them (``count``)."""


def nearest_rank(count: int, fraction: float) -> int:
    """The 1-based rank of the nearest-rank percentile ``fraction`` of ``count`` values."""
    return max(1, math.ceil(fraction * count))


@attrs.frozen
class IndexTally:
    """The index counted for operators' figures: a few aggregate reads, no history."""

    groups: tuple[GroupCount, ...]
    abandoned_by_reason: Mapping[str, int]
    oldest_unresolved: tuple[str, datetime] | None
    """The obligation id and record time of the oldest obligation still owed."""
    delivery: DeliveryTally
    """Record to delivery, of every delivered obligation."""
    quarantined_ids: tuple[str, ...]
    """The oldest quarantined obligations' ids (at most the number asked for)."""


@attrs.frozen
class UndecodableEntry:
    """An obligation the index quarantined because one of its events did not decode."""

    aggregate_id: UUID
    obligation_id: str
    version: int
    reason: str


class ObligationIndexView(MaterializedView):
    """The obligation index, as operators' commands and the audit read it (the port)."""

    @abstractmethod
    def entries(self, query: IndexQuery) -> list[IndexEntry]:
        """The obligations ``query`` selects, oldest first (ties: by obligation id)."""

    @abstractmethod
    def tally(
        self, *, max_quarantined_ids: int, latency_bounds: Sequence[float] = ()
    ) -> IndexTally:
        """The figures of ``status`` and ``metrics`` (record to delivery counted against
        ``latency_bounds``, in seconds, ascending)."""

    @abstractmethod
    def undecodable(self) -> list[UndecodableEntry]:
        """Obligations quarantined for an event that did not decode (not for sealed
        fields that fail authentication: those events still read)."""
