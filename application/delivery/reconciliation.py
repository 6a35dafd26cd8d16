"""Settle before re-sending: ask the platform what arrived (ADR 0050).

An adapter may implement one more method, ``reconcile(query) -> ReconcileAnswer``; an
adapter without it is used exactly as before. Whenever the gateway is about to repeat a
send that may have arrived (a runtime retry after an ambiguous failure, a recovered send
after a claim, and so an operator's retry too) it asks first, once:

- ``arrived`` (with the platform's message ids): nothing is sent, the obligation is
  settled ``Delivered`` with those receipts;
- ``not_arrived`` (the platform's answer covers the send's window): re-sent plain;
- ``unknown``: re-sent with the marker, as without reconciliation.

The question never waits longer than its deadline and never blocks the loop; an answer
that is late, raised, or malformed (an arrival without ids, ids already receipted for
another part, ids where none belong) counts as ``unknown``, logged and counted.

An adapter that can reconcile is handed a key on every send (``idempotency_key``: the
obligation id, ``<id>:<part>`` for a multi-part reply) to place on the message as a
nonce or client message id; that is the key it is later asked about. Its
``supports_idempotency`` still decides whether the platform deduplicates on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import attrs

from gateway_ledger.domain.delivery.reconciliation import ReconcileOutcome
from gateway_ledger.domain.values import DeliveryTarget

log = logging.getLogger("gateway_ledger.reconciliation")

DEFAULT_RECONCILE_DEADLINE = 2.0
"""Seconds a reconciliation may take before its send goes out as ``unknown``."""
MAX_MESSAGE_ID_CHARS = 200


@attrs.frozen
class ReconcileQuery:
    """What the gateway asks: did the send carrying ``key`` to ``target`` arrive between
    ``since`` and ``until``? ``part``: the part asked about (None: a one-part reply)."""

    obligation_id: str
    target: DeliveryTarget
    key: str
    part: int | None
    since: datetime
    until: datetime


@attrs.frozen
class ReconcileAnswer:
    """An adapter's answer; build it with :meth:`arrived`, :meth:`not_arrived` or
    :meth:`unknown`. ``evidence``: what it rests on (no message text), for the history."""

    outcome: ReconcileOutcome
    message_ids: tuple[str, ...] = ()
    evidence: str = ""

    @classmethod
    def arrived(cls, *message_ids: str, evidence: str = "") -> ReconcileAnswer:
        return cls(ReconcileOutcome.ARRIVED, tuple(message_ids), evidence)

    @classmethod
    def not_arrived(cls, evidence: str = "") -> ReconcileAnswer:
        return cls(ReconcileOutcome.NOT_ARRIVED, (), evidence)

    @classmethod
    def unknown(cls, evidence: str = "") -> ReconcileAnswer:
        return cls(ReconcileOutcome.UNKNOWN, (), evidence)


@runtime_checkable
class ReconcilingAdapter(Protocol):
    """The optional capability: a platform that can say what arrived."""

    async def reconcile(self, query: ReconcileQuery) -> ReconcileAnswer: ...


def can_reconcile(adapter: object) -> bool:
    return callable(getattr(adapter, "reconcile", None))


def wants_key(adapter: object) -> bool:
    """Whether sends through ``adapter`` carry the send's key: it reconciles by it, or
    its status callbacks name the obligation by it (``attach_status_sink``)."""
    return can_reconcile(adapter) or callable(getattr(adapter, "attach_status_sink", None))


def send_key(obligation_id: str, part: int, single: bool) -> str:
    """The key placed on a send: the obligation id, or ``<id>:<part>`` for one part of
    many (the same rule as the idempotency key, ADR 0072)."""
    return obligation_id if single else f"{obligation_id}:{part}"


def obligation_of(key: str) -> str:
    """The obligation id in a send's key (what a status callback echoes back)."""
    return key.split(":", 1)[0]


@attrs.define
class ReconcileCounters:
    asked: int = 0
    arrived: int = 0
    not_arrived: int = 0
    unknown: int = 0
    bad_answers: int = 0
    """Answers that failed, came too late or made no sense: counted as unknown too."""


class Reconciler:
    """Asks an adapter, bounded by ``deadline``; turns every failure into ``unknown``."""

    def __init__(self, deadline: float = DEFAULT_RECONCILE_DEADLINE) -> None:
        self.deadline = deadline
        self.counters = ReconcileCounters()

    async def ask(
        self, adapter: Any, query: ReconcileQuery, known_ids: Collection[str] = ()
    ) -> ReconcileAnswer:
        """The adapter's answer to ``query``; ``known_ids``: receipts of other parts."""
        self.counters.asked += 1
        try:
            answer = await asyncio.wait_for(adapter.reconcile(query), timeout=self.deadline)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return self._bad(query, f"no answer within {self.deadline} s")
        except Exception as e:
            return self._bad(query, f"reconcile raised {type(e).__name__}")
        problem = answer_problem(answer, known_ids)
        if problem is not None:
            return self._bad(query, problem)
        assert isinstance(answer, ReconcileAnswer)
        if answer.outcome is ReconcileOutcome.ARRIVED:
            self.counters.arrived += 1
        elif answer.outcome is ReconcileOutcome.NOT_ARRIVED:
            self.counters.not_arrived += 1
        else:
            self.counters.unknown += 1
        log.debug("obligation %s reconciled: %s", query.obligation_id, answer.outcome.value)
        return answer

    def _bad(self, query: ReconcileQuery, why: str) -> ReconcileAnswer:
        self.counters.bad_answers += 1
        self.counters.unknown += 1
        log.warning(
            "reconciliation of obligation %s on %s counted as unknown: %s",
            query.obligation_id,
            query.target.platform,
            why,
        )
        return ReconcileAnswer.unknown(f"bad answer: {why}")


def answer_problem(answer: object, known_ids: Collection[str]) -> str | None:
    """Why an adapter's answer cannot be taken (None: it can)."""
    if not isinstance(answer, ReconcileAnswer):
        return f"answered a {type(answer).__name__}, not a ReconcileAnswer"
    if not isinstance(answer.outcome, ReconcileOutcome):
        return "an outcome that is not arrived, not_arrived or unknown"
    if not isinstance(answer.evidence, str):
        return "evidence that is not text"
    ids = answer.message_ids
    if answer.outcome is not ReconcileOutcome.ARRIVED:
        return "message ids without an arrival" if ids else None
    if not ids:
        return "an arrival without the platform's message ids"
    for mid in ids:
        if not isinstance(mid, str) or not mid.strip() or len(mid) > MAX_MESSAGE_ID_CHARS:
            return "a message id that is not a short non-empty text"
        if mid in known_ids:
            return "a message id already receipted for another part"
    return None
