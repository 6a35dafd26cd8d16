"""The duplicate-marker rule (ADR 0006, 0038): when must a send say "this may be a duplicate"?

A reply is re-sent with the marker when an earlier send of it may have reached the user.
A send may have arrived unless the platform said it did not; a refusal strikes off only
the send it answers, never an earlier one (and so does a failure the platform reports
after it accepted a send); a fenced-out owner's late success proves the reply arrived; a
reconciliation that proves nothing arrived strikes off every earlier send, unless a
previous owner only presumed gone may still land one (ADR 0050).
That is the whole rule, and this module is the only place it is written.

Every event that changes the answer carries it (``Attempting.needs_marker``,
``Claimed.needs_marker``, ``Failed.may_have_arrived``,
``LateResultReported.may_have_arrived``), so a reader takes the decision from the event.
Events written before they carried it are derived once, by this same function, from the
fact they state. The aggregate, the views, the audit and the tests' model all go through
:func:`marker_after`.
"""

from __future__ import annotations

from enum import Enum, auto
from typing import NamedTuple

from gateway_ledger.domain.values import ErrorClass, SendGuard


class Marker(NamedTuple):
    """What the history says about arrivals, after some event."""

    may_have_arrived: bool
    """Some send of the reply may have reached the user: the next send needs the marker."""

    arrived_before_this_send: bool
    """One may have before the send in flight started (or a late success proved it):
    what ``may_have_arrived`` falls back to when the platform refuses the send in flight."""


NOTHING_SENT = Marker(may_have_arrived=False, arrived_before_this_send=False)
"""A reply just recorded: nothing of it can have arrived."""


class SendFact(Enum):
    """What an event says about a send, as far as the marker is concerned."""

    STARTED = auto()
    """A send goes out (``Attempting``; ``Claimed``: the claimer sends at once)."""
    REFUSED = auto()
    """The platform said the send in flight did not arrive (a failure that is not
    ambiguous: rejected, rate limited, dead target)."""
    UNCERTAIN = auto()
    """The send in flight failed in a way that may have reached the user (a timeout, a
    reset after the request left)."""
    ARRIVED_LATE = auto()
    """A fenced-out owner reports that its own send was delivered."""
    NOT_ARRIVED = auto()
    """The platform proved that no unconfirmed send of the reply reached the user
    (a reconciliation's ``not_arrived``, ADR 0050), and no send is in flight."""
    EARLIER_NOT_ARRIVED = auto()
    """The same proof while a claim's send is about to go out: nothing sent before the
    claim arrived, but the claimer's own send counts as started (a crash after it must
    still leave the marker up)."""

    @classmethod
    def failure(cls, classification: ErrorClass) -> SendFact:
        """What a failed send says: only an ambiguous failure may have reached the user."""
        return cls.UNCERTAIN if classification.may_have_arrived else cls.REFUSED

    @classmethod
    def late_result(cls, outcome: str) -> SendFact | None:
        """What a fenced-out owner's result says: a delivery proves an arrival; anything
        else it reports (a failure, one part) changes nothing the current owner knows."""
        return cls.ARRIVED_LATE if outcome == "delivered" else None

    @classmethod
    def reconciliation(
        cls,
        *,
        nothing_unconfirmed_arrived: bool,
        claim_pending: bool,
        stray_send_possible: bool = False,
    ) -> SendFact | None:
        """What a reconciliation says (ADR 0050): when it proves that no unconfirmed send
        arrived (``not_arrived``; or the first unconfirmed part arrived and the parts
        after it were never sent), every earlier send is struck off; with a claim's send
        still to go out, all but that one. An ``unknown`` changes nothing, and an
        ``arrived`` that completes the reply is followed by ``Delivered``. Nor does any
        answer while a previous owner's send may still land (``stray_send_possible``: it
        was presumed gone, its lease lapsed, not proven gone): the platform can only
        answer for what has landed so far."""
        if not nothing_unconfirmed_arrived or stray_send_possible:
            return None
        return cls.EARLIER_NOT_ARRIVED if claim_pending else cls.NOT_ARRIVED


def marker_after(before: Marker, fact: SendFact | None, recorded: bool | None = None) -> Marker:
    """The marker after an event that states ``fact`` (None: it says nothing of sends).

    ``recorded`` is the decision the event carries (``needs_marker`` of a send,
    ``may_have_arrived`` of a failure or a late result); None for an event written before
    events carried it, which is then derived here from ``before``.
    """
    if fact is SendFact.STARTED:
        needs = before.may_have_arrived if recorded is None else recorded
        return Marker(may_have_arrived=True, arrived_before_this_send=needs)
    if fact is SendFact.REFUSED or fact is SendFact.UNCERTAIN:
        if recorded is None:
            # A refusal strikes off only the send in flight; an uncertain failure leaves it.
            refused = fact is SendFact.REFUSED
            recorded = before.arrived_before_this_send if refused else before.may_have_arrived
        return Marker(recorded, before.arrived_before_this_send)
    if fact is SendFact.NOT_ARRIVED:
        return Marker(False if recorded is None else recorded, arrived_before_this_send=False)
    if fact is SendFact.EARLIER_NOT_ARRIVED:
        return Marker(True if recorded is None else recorded, arrived_before_this_send=False)
    if fact is SendFact.ARRIVED_LATE:
        arrived = True if recorded is None else recorded
        return Marker(arrived, before.arrived_before_this_send or arrived)
    return before


def send_guard(*, may_have_arrived: bool, native_idempotency: bool) -> SendGuard:
    """What guards a send against an unannounced duplicate (ADR 0006, 0026): the
    platform's own key where it has one, else the marker when an earlier send may have
    arrived (``may_have_arrived``: the marker's answer before this send)."""
    if native_idempotency:
        return SendGuard.IDEMPOTENCY_KEY
    return SendGuard.MARKER if may_have_arrived else SendGuard.NONE
