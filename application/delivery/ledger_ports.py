"""What the delivery use cases need from the machinery under them, declared as ports.

The ledger's use cases (the recovery sweep, the operators' figures, the gateway's
delivery path) are written against these protocols; the store, the lease heartbeat, the
group-commit writer and the bulk loader that satisfy them live in ``infrastructure/``
and are wired together in ``gateway_ledger/bootstrap.py``. A test may wire fakes instead
(``tests/test_bootstrap.py``). The modules that hold the use cases import this module,
never ``ledger.py``: the ledger delegates to them, they do not reach back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol, TypeVar
from uuid import UUID

from eventsourcing.persistence import Recording

from gateway_ledger.application.clock import Clock
from gateway_ledger.application.privacy.ports import SealingMapper
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity, QuarantineReason
from gateway_ledger.projections.delivery.obligation_index import ObligationIndexView
from gateway_ledger.projections.delivery.recoverable import RecoverableView

T = TypeVar("T")

LivenessPolicy = Callable[[OwnerIdentity], bool]
"""Answers "may this owner still be working on it?"; True keeps the sweep's hands off.

Implemented by ``/proc`` on one host and by leases across hosts
(``infrastructure/ownership/liveness.py``, ADR 0010)."""

GoneProof = Callable[[OwnerIdentity], bool]
"""Answers "is this owner's process proven gone?" (this host, its process no longer runs):
True lets a claim record that no send of its can still land; a lapsed lease alone is not
proof, the owner may be paused with a send on its way (ADR 0050)."""


# -- ownership ---------------------------------------------------------------------------


class LeaseTiming(Protocol):
    @property
    def renew_every(self) -> float: ...


class LeaseHolder(Protocol):
    """This owner's lease as the delivery path checks it before a hand-off (ADR 0032)."""

    @property
    def lapses(self) -> int:
        """Renewals that landed after the local deadline: ownership must be proven again."""

    @property
    def settings(self) -> LeaseTiming: ...

    def holds(self, margin: float = 0.0) -> bool:
        """True while the lease is provably valid for ``margin`` more seconds."""

    def renew(self) -> None:
        """Renew once now; raises what the store raised."""


# -- bulk reads --------------------------------------------------------------------------


class UnreadableEvent(Protocol):
    """The first event of an aggregate that could not be decoded (ADR 0027)."""

    @property
    def reason(self) -> QuarantineReason: ...

    @property
    def originator_version(self) -> int: ...


class Openings(Protocol):
    """What opening sealed fields found: erased subjects, fields failing authentication."""

    @property
    def erased(self) -> Collection[UUID]: ...

    @property
    def unreadable(self) -> Mapping[UUID, int]: ...


class Loaded(Protocol):
    """Aggregates read each on its own: one bad event fails only its own aggregate."""

    @property
    def aggregates(self) -> Mapping[UUID, Any]: ...

    @property
    def undecodable(self) -> Mapping[UUID, UnreadableEvent]: ...

    @property
    def openings(self) -> Openings: ...


# -- the ledger, as its use cases see it -------------------------------------------------


class EventAppender(Protocol):
    """The one write path: appends an aggregate's new events (sealed, with their keys)."""

    def append(self, domain_events: Sequence[Any], **kwargs: Any) -> None: ...

    def put(self, domain_events: Sequence[Any], **kwargs: Any) -> list[Recording[UUID]]:
        """The same write, returning each event with the notification the log made of it."""
        ...


class LedgerPort(Protocol):
    """The delivery ledger as the sweep, the operators' queries and erasure use it."""

    @property
    def owner(self) -> OwnerIdentity: ...

    @property
    def policy(self) -> LedgerPolicy: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def private_mapper(self) -> SealingMapper: ...

    @property
    def liveness(self) -> LivenessPolicy: ...

    @property
    def gone_proof(self) -> GoneProof: ...

    @property
    def recoverable(self) -> RecoverableView: ...

    @property
    def obligation_index(self) -> ObligationIndexView: ...

    @property
    def events(self) -> Any: ...

    @property
    def recorder(self) -> Any: ...

    def save(self, *objs: Any, **kwargs: Any) -> Any: ...

    def aggregate_id(self, obligation_id: str) -> UUID: ...

    def load_each(
        self, aggregate_ids: Sequence[UUID], viewed: Mapping[UUID, int] | None = None
    ) -> Loaded: ...

    def load(self, obligation_id: str) -> DeliveryObligation: ...

    def save_transition(self, obligation: DeliveryObligation, transition: str) -> None: ...

    def store_changes(
        self, obligations: Sequence[DeliveryObligation]
    ) -> Sequence[Recording[UUID]]: ...

    def change(
        self,
        obligation_id: str,
        transition: str,
        decide: Callable[[DeliveryObligation], object],
    ) -> DeliveryObligation: ...


# -- the gateway's writer ----------------------------------------------------------------


class Written(Protocol):
    """How one queued write ended: what a later write of the same obligation chains on."""

    def done(self) -> bool: ...

    def exception(self) -> BaseException | None: ...


class WriterCounts(Protocol):
    @property
    def commits(self) -> int: ...

    @property
    def events(self) -> int: ...

    @property
    def largest_group(self) -> int: ...

    @property
    def conflicts(self) -> int: ...


class EventWriter(Protocol):
    """Saves the gateway's events off the event loop, many deliveries per commit (ADR 0009)."""

    @property
    def stats(self) -> WriterCounts: ...

    def submit_waiting(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Any = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> tuple[Written, asyncio.Future[None]]:
        """Queue events; await the future for them to be durable. ``loop``: the caller's
        running loop, when it has it at hand (else it is asked for)."""

    def submit_behind(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Any = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Written:
        """Queue events to ride with the next commit; nobody waits for them (ADR 0016).
        ``loop``: as for :meth:`submit_waiting`."""

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` off the loop after this process's queued writes landed."""

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` off the loop at once (a read that must not wait behind a write)."""

    async def flush(self) -> None:
        """Wait until every write queued behind so far has landed or failed."""

    def close(self) -> None:
        """Finish what is queued and stop."""
