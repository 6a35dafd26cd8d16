"""The duplicate audit: replay every stored event and say who may have been told twice.

It streams the notification log in pages and reads each event's clear fields straight
from its stored JSON (owner, fence, classification, marker): no aggregate is reloaded,
nothing is decrypted, so a replay of a whole log stays a scan (``benchmarks/audit.py``).
Each stored topic names one of the obligation's event classes, and the replay dispatches
on that class; whether a send needed the marker is the marker rule's answer
(``gateway_ledger.domain.delivery.marker``).
What it flags, and why, is ADR 0011:

- a *possible duplicate*: two or more sends of one obligation that may have arrived (a
  send may have arrived unless the platform said it did not). It is *labelled* when
  every send after the first possibly-arrived one carried the duplicate marker: that is
  the ledger working as designed under ambiguity, reported but not a problem;
- ``unmarked_resend``: a send started after one that may have arrived, without the marker
  (or the platform's idempotency key). Since ADR 0026 the gateway records in each
  ``Attempting`` what guarded that send; a send that says no guard (the synchronous API,
  or written before ADR 0026) went out as its recorded ``needs_marker`` says, or, written
  before sends recorded that, as the marker rule derives it;
- ``double_claim``: two claims at the same fence, or a claim whose previous owner was not
  the owner on record (the claimer acted on someone else's live claim);
- ``claim_from_live_owner``: the owner that a claim (or an operator's retry) displaced
  appended an event afterwards, so it was alive;
- ``late_result``: a result reported by an owner that had been fenced out (or an event
  flagged ``late`` by the store);
- ``undecodable_event``: an event this version cannot decode (a flipped byte, an event
  type a newer release wrote); its obligation is quarantined and its later events are not
  judged (ADR 0027). Which events decode is the views' verdict (the obligation index,
  caught up first, records each with its version), so the audit and ``list --state
  quarantined`` always agree and the replay itself stays a scan of clear JSON;
- ``unreadable_fields``: a ``Quarantined`` fact: a reader found sealed personal fields
  that fail authentication (tampered or rotted), so the reply is never sent;
- ``resend_after_arrived``: a send started after the platform answered a reconciliation
  with ``arrived`` (ADR 0050), unless a failure after acceptance reopened it since.

A reconciliation's ``not_arrived`` strikes off the sends it covers, so the plain re-send
after it is no possible duplicate; an ``arrived`` settles the reply with no re-send. Each
such answer given while the marker was up is a labelled possible duplicate avoided
(``avoided_duplicates``); ``reconciled`` counts the answers by outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import orjson
from eventsourcing.utils import get_topic

from gateway_ledger.domain.delivery.marker import NOTHING_SENT, SendFact, marker_after
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.delivery.reconciliation import PlatformStatus, ReconcileOutcome
from gateway_ledger.domain.values import QuarantineReason, SendGuard
from gateway_ledger.projections.delivery.obligation_index import ObligationIndexView

if TYPE_CHECKING:
    from eventsourcing.application import Application

log = logging.getLogger("gateway_ledger.audit")

PAGE_SIZE = 5000

_PREFIX = get_topic(DeliveryObligation) + "."
_GUARDED = frozenset({SendGuard.MARKER.value, SendGuard.IDEMPOTENCY_KEY.value})
"""Recorded send guards that keep a possible duplicate from going unannounced."""

_EVENT_CLASSES: dict[str, type[DeliveryObligation.Event]] = {
    get_topic(value): value
    for value in vars(DeliveryObligation).values()
    if isinstance(value, type) and issubclass(value, DeliveryObligation.Event)
}
"""The obligation's event types this version knows, by stored topic."""

PROBLEM_KINDS = (
    "unmarked_resend",
    "double_claim",
    "claim_from_live_owner",
    "late_result",
    "undecodable_event",
    "unreadable_fields",
    "resend_after_arrived",
)


@attrs.frozen
class AuditFinding:
    """One problem in one obligation's history, at the event (version) that shows it."""

    kind: str
    obligation_id: str
    version: int
    timestamp: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class PossibleDuplicate:
    """An obligation with two or more sends that may have reached the user."""

    obligation_id: str
    sends: int
    labelled: bool
    send_versions: tuple[int, ...]
    state: str

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["send_versions"] = list(self.send_versions)
        return data


@attrs.frozen
class DuplicateAudit:
    """The audit's report. ``ok`` is False when any problem was found."""

    events_scanned: int
    obligations: int
    position: int
    elapsed_seconds: float
    findings: tuple[AuditFinding, ...]
    possible_duplicates: tuple[PossibleDuplicate, ...]
    avoided_duplicates: int = 0
    """Re-sends that would have carried the marker, settled instead by the platform's
    answer: not re-sent (``arrived``) or re-sent plain (``not_arrived``)."""
    reconciled: dict[str, int] = attrs.field(factory=dict)
    """Reconciliation answers by outcome (arrived, not_arrived, unknown)."""

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def labelled_duplicates(self) -> int:
        return sum(1 for d in self.possible_duplicates if d.labelled)

    @property
    def unlabelled_duplicates(self) -> int:
        return sum(1 for d in self.possible_duplicates if not d.labelled)

    def counts(self) -> dict[str, int]:
        found = dict.fromkeys(PROBLEM_KINDS, 0)
        for f in self.findings:
            found[f.kind] = found.get(f.kind, 0) + 1
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "events_scanned": self.events_scanned,
            "obligations": self.obligations,
            "position": self.position,
            "elapsed_seconds": self.elapsed_seconds,
            "problems": self.counts(),
            "possible_duplicates": len(self.possible_duplicates),
            "labelled_duplicates": self.labelled_duplicates,
            "unlabelled_duplicates": self.unlabelled_duplicates,
            "avoided_duplicates": self.avoided_duplicates,
            "reconciled": dict(self.reconciled),
            "findings": [f.to_dict() for f in self.findings],
            "duplicates": [d.to_dict() for d in self.possible_duplicates],
        }


Owner = tuple[Any, ...]
Event = DeliveryObligation.Event


def _when(state: dict[str, Any]) -> str:
    """An event's time as ISO 8601 text, read from its stored encoding (a tagged value)."""
    stamp = state.get("timestamp")
    return str(stamp.get("_data_") if isinstance(stamp, dict) else stamp)


def _fenced_out(ob: _Obligation, state: dict[str, Any], by: Owner) -> bool:
    """``DeliveryObligation.is_fenced_out``, on the audit's replay of the history."""
    fence = state.get("fence")
    return (ob.fence > 0 and by != ob.owner) or (fence is not None and int(fence) < ob.fence)


class _Malformed(ValueError):
    """Valid JSON of the wrong shape where a fact must be (a flipped bit inside a value,
    written after the index caught up): the mapper refuses such an event too."""


def _owner(value: Any) -> Owner:
    data = value.get("_data_", value) if isinstance(value, dict) else {}
    if not isinstance(data, dict) or "_type_" in data:
        raise _Malformed("owner without its data")
    owner = tuple(data.values())
    if any(isinstance(v, dict | list) for v in owner):
        raise _Malformed("owner with a nested value")
    return owner


def _send_fact(kind: type[Event], state: dict[str, Any]) -> SendFact | None:
    """What the event says of a send, read from its clear fields."""
    try:
        return kind.send_fact(state)
    except (KeyError, ValueError) as e:
        raise _Malformed(f"{kind.__name__} without a readable {e}") from None


class _Send:
    __slots__ = ("by", "marked", "may_have_arrived", "version")

    def __init__(self, version: int, by: Owner, marked: bool) -> None:
        self.version = version
        self.by = by
        self.marked = marked
        self.may_have_arrived = True  # until the platform says otherwise


class _Obligation:
    """What the replay remembers of one obligation: owners, fences, the marker, sends."""

    __slots__ = (
        "arrived_proven",
        "claimed_fences",
        "displaced",
        "fence",
        "marker",
        "oid",
        "owner",
        "sends",
        "state",
    )

    def __init__(self, oid: str, owner: Owner) -> None:
        self.oid = oid
        self.owner = owner
        self.fence = 0
        self.state = "pending"
        self.marker = NOTHING_SENT  # as the rule derives it from the facts so far
        self.sends: list[_Send] = []
        self.claimed_fences: set[int] = set()
        self.displaced: dict[Owner, int] = {}  # fenced-out owner -> version that displaced it
        self.arrived_proven = False  # a reconciliation said the reply arrived (ADR 0050)

    def last_send_by(self, by: Owner) -> _Send | None:
        for send in reversed(self.sends):
            if send.by == by:
                return send
        return None


Handler = Callable[["DuplicateAuditor", _Obligation, int, dict[str, Any], "Owner | None"], None]


class DuplicateAuditor:
    """Replays events in notification order; call :meth:`feed` per page, then :meth:`report`.

    Whether a send needed the marker is the marker rule's answer
    (``domain/delivery/marker.py``), derived here with the rule's own function from the
    facts each event states, not taken from the decisions the events record: the audit
    judges what was recorded and sent against the rule.
    """

    def __init__(self) -> None:
        self.obligations: dict[str, _Obligation] = {}
        self.findings: list[AuditFinding] = []
        self.events = 0
        self.position = 0
        self._reported_live: set[tuple[str, Owner]] = set()
        self.unjudged: set[str] = set()  # obligations with an undecodable event
        self.avoided = 0
        self.reconciled = dict.fromkeys((o.value for o in ReconcileOutcome), 0)
        self.poisoned: dict[str, tuple[str, int, str]] = {}
        """aggregate id -> (obligation id, version, why): the views' undecodable events."""

    def flag(
        self, kind: str, ob: _Obligation, version: int, state: dict[str, Any], why: str
    ) -> None:
        self.findings.append(AuditFinding(kind, ob.oid, version, _when(state), why))

    def undecodable(self, key: str, obligation_id: str, version: int, why: str) -> None:
        """An event that does not decode: a problem, and its obligation is not judged on."""
        if key in self.unjudged:
            return
        ob = self.obligations.get(key)
        if ob is None:
            ob = self.obligations[key] = _Obligation(obligation_id, ())
        self.unjudged.add(key)
        self.findings.append(
            AuditFinding("undecodable_event", ob.oid, version, "", f"{why} (quarantined)")
        )

    def feed(self, originator_id: Any, version: int, topic: str, raw: bytes) -> None:
        self.events += 1
        if not topic.startswith(_PREFIX):
            return  # not an obligation's event (erasures, other aggregates)
        key = str(originator_id)
        if key in self.unjudged:
            return  # a transition before this one is unknown: nothing after it is judged
        poisoned = self.poisoned.get(key)
        if poisoned is not None and version >= poisoned[1]:
            self.undecodable(key, poisoned[0], poisoned[1], poisoned[2])
            return
        try:
            state: dict[str, Any] = orjson.loads(raw)
        except orjson.JSONDecodeError as e:  # written after the index caught up
            self.undecodable(key, key, version, f"undecodable: {e}")
            return
        kind = _EVENT_CLASSES.get(topic)
        if kind is None:
            self.undecodable(key, key, version, f"unknown_topic: {topic}")
            return
        try:
            self.judge(key, version, kind, state)
        except _Malformed as e:
            self.undecodable(key, key, version, f"undecodable: {e}")

    def judge(self, key: str, version: int, kind: type[Event], state: dict[str, Any]) -> None:
        """One decoded obligation event, in order: the audit's rules."""
        if kind is DeliveryObligation.Recorded:
            self.obligations[key] = _Obligation(
                str(state.get("obligation_id") or key), _owner(state.get("owner"))
            )
            return
        ob = self.obligations.get(key)
        if ob is None:
            return  # an event of an aggregate whose creation we never saw (cannot judge)
        by = _owner(state["by"]) if state.get("by") else None
        fact = _send_fact(kind, state)
        if by is not None and by in ob.displaced and (key, by) not in self._reported_live:
            self._reported_live.add((key, by))
            self.flag(
                "claim_from_live_owner",
                ob,
                version,
                state,
                f"the owner displaced at v{ob.displaced[by]} appended "
                f"{kind.__name__} at v{version}",
            )
        if state.get("late"):
            self.flag(
                "late_result",
                ob,
                version,
                state,
                f"{kind.__name__} reported late by a fenced owner",
            )
        else:
            handler = _HANDLERS.get(kind)
            if handler is not None:
                handler(self, ob, version, state, by)
        ob.marker = marker_after(ob.marker, fact)

    # -- one method per event type ----------------------------------------------------------

    def _start_send(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner, marked: bool
    ) -> None:
        if ob.arrived_proven:
            self.flag(
                "resend_after_arrived",
                ob,
                version,
                state,
                "a send after the platform said the reply had arrived",
            )
        if ob.marker.may_have_arrived and not marked:
            earlier = [s.version for s in ob.sends if s.may_have_arrived]
            self.flag(
                "unmarked_resend",
                ob,
                version,
                state,
                f"re-send without the marker after the send(s) at v{earlier} may have arrived",
            )
        ob.sends.append(_Send(version, by, marked))

    def on_attempting(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        assert by is not None
        if by != ob.owner and ob.fence > 0:
            self.flag("late_result", ob, version, state, "a send started by a fenced-out owner")
            # It did not read the history that asks for a marker: unmarked.
            self._start_send(ob, version, state, by, marked=False)
            return
        ob.owner = by
        ob.state = "attempting"
        # A guard not said (the synchronous API, or written before ADR 0026) is taken as
        # the rule followed: the send went out as its recorded decision says, or (written
        # before events carried it) as the rule derives it from this very history.
        guard = state.get("guard")
        if guard is not None:
            marked = guard in _GUARDED
        else:
            needs_marker = state.get("needs_marker")
            marked = ob.marker.may_have_arrived if needs_marker is None else bool(needs_marker)
        self._start_send(ob, version, state, by, marked=marked)

    def on_claimed(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        assert by is not None
        fence = int(state.get("fence", ob.fence + 1))
        previous = _owner(state.get("previous_owner"))
        if fence in ob.claimed_fences:
            self.flag("double_claim", ob, version, state, f"a second claim at fence {fence}")
        elif previous and previous != ob.owner:
            self.flag(
                "double_claim",
                ob,
                version,
                state,
                "claimed from an owner that no longer held it (another claim was live)",
            )
        ob.claimed_fences.add(fence)
        ob.displaced[ob.owner] = version
        ob.displaced.pop(by, None)
        ob.owner = by
        ob.fence = fence
        ob.state = "claimed"
        self._start_send(ob, version, state, by, marked=bool(state.get("needs_marker")))

    def on_retry_requested(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        assert by is not None
        ob.displaced[ob.owner] = version
        ob.displaced.pop(by, None)
        ob.owner = by
        ob.fence = int(state.get("fence", ob.fence + 1))
        ob.state = "pending"

    def _result(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None, kind: str
    ) -> _Send | None:
        """The send a result speaks for, as the aggregate decides it (ADR 0010): a result
        from a fenced-out owner is late and about that owner's own send; any other result
        is a transition about the current send, whoever reports it (before a claim, the
        upstream API lets any process report)."""
        if by is not None and _fenced_out(ob, state, by):
            self.flag("late_result", ob, version, state, f"{kind} from a fenced-out owner")
            return ob.last_send_by(by)
        return ob.sends[-1] if ob.sends else None

    def on_delivered(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        self._result(ob, version, state, by, "Delivered")
        ob.state = "delivered"

    def on_part_delivered(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        self._result(ob, version, state, by, "PartDelivered")

    def on_failed(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        send = self._result(ob, version, state, by, "Failed")
        if send is not None and _send_fact(DeliveryObligation.Failed, state) is SendFact.REFUSED:
            send.may_have_arrived = False  # the platform said no: this send never arrived
        if by is None or not _fenced_out(ob, state, by):
            ob.state = "failed"

    def on_reconciled(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        """The platform's answer before a re-send: what it proves about the sends so far."""
        outcome = ReconcileOutcome(state["outcome"])
        self.reconciled[outcome.value] += 1
        if outcome is ReconcileOutcome.UNKNOWN:
            return
        fact = _send_fact(DeliveryObligation.Reconciled, state)
        completes = outcome is ReconcileOutcome.ARRIVED and bool(state.get("completes"))
        if fact is None and not completes:
            return  # a presumed-gone owner's send may still land: it proves nothing of it
        pending = bool(state.get("claim_pending"))
        due = ob.marker.arrived_before_this_send if pending else ob.marker.may_have_arrived
        if due:
            self.avoided += 1
        covered = ob.sends[:-1] if pending and ob.sends else ob.sends
        if fact in (SendFact.NOT_ARRIVED, SendFact.EARLIER_NOT_ARRIVED):
            for send in covered:
                send.may_have_arrived = False  # the platform's answer covers it
            if pending and ob.sends:
                ob.sends[-1].marked = False  # the claim's send now goes out plain
            return
        # Arrived, and nothing left to send: the claim's send, if one was due, never left.
        if pending and ob.sends:
            ob.sends.pop()
        ob.arrived_proven = True

    def on_status_reported(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        """A failure after acceptance: the delivered send never reached the user."""
        if state.get("status") != PlatformStatus.FAILED_AFTER_ACCEPTANCE:
            return
        if ob.sends:
            ob.sends[-1].may_have_arrived = False
        ob.arrived_proven = False
        ob.state = "failed"

    def on_quarantined(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        assert by is not None
        reason = str(state.get("reason"))
        kind = "unreadable_fields" if reason == QuarantineReason.UNREADABLE else "undecodable_event"
        self.flag(kind, ob, version, state, f"quarantined: {reason} at v{state.get('found_at')}")
        ob.displaced[ob.owner] = version
        ob.displaced.pop(by, None)
        ob.owner = by
        ob.fence = int(state.get("fence", ob.fence + 1))

    def on_abandoned(
        self, ob: _Obligation, version: int, state: dict[str, Any], by: Owner | None
    ) -> None:
        ob.state = "abandoned"

    # -- the report -------------------------------------------------------------------------

    def duplicates(self) -> Iterator[PossibleDuplicate]:
        for ob in self.obligations.values():
            arrived = [s for s in ob.sends if s.may_have_arrived]
            if len(arrived) < 2:
                continue
            labelled = all(s.marked for s in arrived[1:])
            yield PossibleDuplicate(
                ob.oid, len(arrived), labelled, tuple(s.version for s in arrived), ob.state
            )

    def report(self, elapsed: float) -> DuplicateAudit:
        return DuplicateAudit(
            events_scanned=self.events,
            obligations=len(self.obligations),
            position=self.position,
            elapsed_seconds=round(elapsed, 3),
            findings=tuple(self.findings),
            possible_duplicates=tuple(self.duplicates()),
            avoided_duplicates=self.avoided,
            reconciled=dict(self.reconciled),
        )


_HANDLERS: dict[type[Event], Handler] = {
    DeliveryObligation.Attempting: DuplicateAuditor.on_attempting,
    DeliveryObligation.Claimed: DuplicateAuditor.on_claimed,
    DeliveryObligation.RetryRequested: DuplicateAuditor.on_retry_requested,
    DeliveryObligation.DeadLetterRetried: DuplicateAuditor.on_retry_requested,
    DeliveryObligation.Delivered: DuplicateAuditor.on_delivered,
    DeliveryObligation.PartDelivered: DuplicateAuditor.on_part_delivered,
    DeliveryObligation.Failed: DuplicateAuditor.on_failed,
    DeliveryObligation.Quarantined: DuplicateAuditor.on_quarantined,
    DeliveryObligation.Abandoned: DuplicateAuditor.on_abandoned,
    DeliveryObligation.Reconciled: DuplicateAuditor.on_reconciled,
    DeliveryObligation.StatusReported: DuplicateAuditor.on_status_reported,
}
"""What each event type changes in the replay (Recorded starts it; late results are only
flagged)."""


def undecodable_events(app: Application[Any]) -> dict[str, tuple[str, int, str]]:
    """The events the obligation index found undecodable (caught up first), by aggregate."""
    index: ObligationIndexView | None = getattr(app, "obligation_index", None)
    if index is None:
        return {}
    index.catch_up()
    return {
        str(e.aggregate_id): (e.obligation_id, e.version, e.reason) for e in index.undecodable()
    }


def audit_duplicates(
    app: Application[Any],
    *,
    page_size: int = PAGE_SIZE,
    progress: Callable[[int, int], None] | None = None,
    archived: Iterable[tuple[Any, int, str, bytes]] = (),
) -> DuplicateAudit:
    """Replay the whole notification log of ``app`` (a DeliveryLedger) and judge it;
    ``archived`` events (pruned obligations' streams, in order) are replayed first."""
    started = time.perf_counter()
    recorder: Any = app.recorder
    newest = recorder.max_notification_id() or 0
    auditor = DuplicateAuditor()
    auditor.poisoned = undecodable_events(app)
    for originator_id, version, topic, raw in archived:
        auditor.feed(originator_id, version, topic, raw)
    start = 0
    while True:
        page = recorder.select_notifications(start, page_size, inclusive_of_start=False)
        for n in page:
            auditor.feed(n.originator_id, n.originator_version, n.topic, n.state)
        if page:
            start = auditor.position = page[-1].id
            if progress is not None:
                progress(start, max(newest, start))
        if len(page) < page_size:
            break
    report = auditor.report(time.perf_counter() - started)
    log.info(
        "audit: %d events, %d obligations, %d problems %s, %d possible duplicates "
        "(%d labelled) in %.2f s",
        report.events_scanned,
        report.obligations,
        len(report.findings),
        report.counts(),
        len(report.possible_duplicates),
        report.labelled_duplicates,
        report.elapsed_seconds,
    )
    return report
