"""The composition root: what it wires, that constructors start nothing, and the gateway
wired with fakes where a store is not the point (cosmicpython's ``bootstrap`` tests)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import attrs
from eventsourcing.persistence import IntegrityError

import gateway_ledger
from gateway_ledger import bootstrap
from gateway_ledger.application.delivery import gateway as delivery_gateway
from gateway_ledger.application.delivery import ledger as delivery_ledger
from gateway_ledger.application.delivery.ports import Reply, ReplyContext, SendResult
from gateway_ledger.application.delivery.scheduling import ManualScheduler
from gateway_ledger.application.privacy.erasure import DELIVERY_PRIVACY
from gateway_ledger.domain.errors import ConcurrentUpdate
from gateway_ledger.domain.values import ErrorClass, LedgerPolicy, OwnerIdentity
from gateway_ledger.infrastructure.eventstore.store import store_environment
from gateway_ledger.infrastructure.ownership.leases import LeaseSettings
from tests.gateway_fakes import MemorySessions, ScriptedAdapter

T = TypeVar("T")
T0 = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
CTX = ReplyContext(session_key="agent:main:telegram:dm:5", platform="telegram", chat_id="5")


def lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gateway-ledger-lease")]


# -- what bootstrap wires -----------------------------------------------------------------


def test_the_public_classes_are_the_wired_ones() -> None:
    assert gateway_ledger.DeliveryLedger is bootstrap.DeliveryLedger
    assert gateway_ledger.Gateway is bootstrap.Gateway
    assert issubclass(bootstrap.DeliveryLedger, delivery_ledger.DeliveryLedger)
    assert issubclass(bootstrap.Gateway, delivery_gateway.Gateway)
    # The stored identity and the sealing policy survive the subclassing.
    assert bootstrap.DeliveryLedger.name == delivery_ledger.LEDGER_APPLICATION_NAME
    assert bootstrap.DeliveryLedger.privacy_policy is DELIVERY_PRIVACY


def test_the_application_ledger_is_abstract_over_its_ports() -> None:
    assert delivery_ledger.DeliveryLedger.__abstractmethods__ == frozenset(
        {
            "private_mapper",
            "liveness",
            "gone_proof",
            "load_each",
            "start",
            "construct_recoverable_view",
            "construct_obligation_index",
            "kept",
            "sealed_events",
        }
    )


def test_a_constructor_starts_nothing_and_writes_no_file(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    before = lease_threads()
    ledger = bootstrap.DeliveryLedger(
        store_environment(db), lease=LeaseSettings(ttl=3.0, renew_every=1.0, enabled=True)
    )
    try:
        assert ledger.leases is not None and ledger.heartbeat is None
        assert lease_threads() == before
        assert not Path(f"{db}.installation-id").exists()
        ledger.start()
        assert ledger.heartbeat is not None and ledger.heartbeat.running
        assert ledger.leases.lookup(ledger.owner).expires_at is not None
        ledger.start()  # idempotent: still one heartbeat
        assert len(lease_threads()) == len(before) + 1
    finally:
        ledger.close()
    assert ledger.heartbeat is None and lease_threads() == before


def test_open_writes_the_installation_id_and_starts_the_lease(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    lease = LeaseSettings(ttl=3.0, renew_every=1.0, enabled=True)
    with_lease = bootstrap.open_ledger(db, lease=lease)
    try:
        assert with_lease.heartbeat is not None and with_lease.heartbeat.running
        stored = Path(f"{db}.installation-id").read_text().strip()
        assert with_lease.owner.installation_id == stored
    finally:
        with_lease.close()
    again = bootstrap.DeliveryLedger.open(db)  # no leases on SQLite by default
    try:
        assert again.heartbeat is None and again.owner.installation_id == stored
    finally:
        again.close()


# -- the gateway wired with fakes -----------------------------------------------------------


@attrs.define
class Counts:
    commits: int = 0
    events: int = 0
    largest_group: int = 0
    conflicts: int = 0


class Done:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def done(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return self.error


class InlineWriter:
    """An ``EventWriter`` that saves each write at once, on the caller's thread: no writer
    thread, no group commit, the same answers (a lost race is ``ConcurrentUpdate``)."""

    def __init__(self, ledger: delivery_ledger.DeliveryLedger) -> None:
        self.ledger = ledger
        self.stats = Counts()
        self.closed = False

    def _save(self, events: Sequence[Any], label: str) -> BaseException | None:
        try:
            self.ledger.save(*events)
        except IntegrityError:
            self.stats.conflicts += 1
            return ConcurrentUpdate("DeliveryObligation", label, "write")
        self.stats.commits += 1
        self.stats.events += len(events)
        self.stats.largest_group = max(self.stats.largest_group, 1)
        return None

    def submit_waiting(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Any = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> tuple[Done, asyncio.Future[None]]:
        error = self._save(events, label)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if error is None:
            waiter.set_result(None)
        else:
            waiter.set_exception(error)
        return Done(error), waiter

    def submit_behind(
        self,
        events: Sequence[Any],
        *,
        label: str = "",
        after: Any = None,
        on_error: Callable[[BaseException], object] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Done:
        error = self._save(events, label)
        if error is not None and on_error is not None:
            on_error(error)
        return Done(error)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


@attrs.frozen
class Loaded:
    aggregates: dict[UUID, Any]
    undecodable: dict[UUID, Any] = attrs.field(factory=dict)
    openings: Any = attrs.field(factory=lambda: Openings(set(), {}))


@attrs.frozen
class Openings:
    erased: set[UUID]
    unreadable: dict[UUID, int]


class NoKeyTable:
    def probe_write(self) -> None:
        """The in-memory store takes every write: nothing to probe."""


class ClearKeys:
    """Keys of a store that seals nothing: every subject is its session key's hash."""

    table = NoKeyTable()

    def subject_id(self, session_key: str) -> str:
        return hashlib.sha256(session_key.encode()).hexdigest()[:32]


class ClearMapper:
    keyring = ClearKeys()
    policy = DELIVERY_PRIVACY
    first_event = None

    def subject_of(self, originator_id: UUID) -> str | None:
        return None

    def sealed(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


class KeepsNothing:
    """No decrypted copies between writes: every change reloads (the ledger's contract holds)."""

    def take(self, aggregate_id: UUID) -> Any | None:
        return None

    def keep(self, aggregate: Any) -> None:
        pass


class PutThrough:
    """The one write path on the library's in-memory store: its public ``put``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def append(self, domain_events: Sequence[Any], **kwargs: Any) -> None:
        self.app.events.put(list(domain_events))


class InMemoryLedger(delivery_ledger.DeliveryLedger):
    """The application ledger on the library's in-memory store, its ports in memory: no
    sealing (nothing is stored), every owner alive, loads through the repository."""

    name = delivery_ledger.LEDGER_APPLICATION_NAME

    def construct_transcoder(self) -> Any:
        return bootstrap.build_transcoder()

    @property
    def private_mapper(self) -> Any:
        return ClearMapper()

    @property
    def liveness(self) -> Callable[[OwnerIdentity], bool]:
        return lambda owner: True

    @property
    def gone_proof(self) -> Callable[[OwnerIdentity], bool]:
        return lambda owner: False  # no process to judge: only presumed gone

    def load_each(
        self, aggregate_ids: Sequence[UUID], viewed: Mapping[UUID, int] | None = None
    ) -> Loaded:
        """As the store's: an aggregate a view shows at a version is the aggregate as of
        that version (ADR 0080), so a write made from it is fenced like the real one's."""
        seen = viewed or {}
        return Loaded(
            {
                i: self.repository.get(i, version=seen.get(i))
                for i in aggregate_ids
                if i in self.repository
            }
        )

    @property
    def kept(self) -> Any:
        return KeepsNothing()

    @property
    def sealed_events(self) -> Any:
        return PutThrough(self)

    def construct_recoverable_view(self) -> Any:
        raise AssertionError("the delivery path read a view: here only the sweep may")

    def construct_obligation_index(self) -> Any:
        raise AssertionError("the delivery path read the operators' index")

    def start(self) -> InMemoryLedger:
        return self


class SteppingClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now


def test_the_gateway_runs_on_fakes_where_the_store_is_not_the_point() -> None:
    """In memory (the library's POPO store, ports in memory), a stepping clock, an inline writer,
    a sweep that finds nothing, sessions in memory, a manual scheduler, a scripted
    platform: the delivery path's decisions, with no thread and no file."""
    threads = threading.active_count()
    clock = SteppingClock()
    ledger = InMemoryLedger(
        {"PERSISTENCE_MODULE": "eventsourcing.popo"},
        owner=OwnerIdentity(host="h", boot_id="b", pid=7, start_time=1, installation_id="i"),
        clock=clock,
        policy=LedgerPolicy(retry_backoff=(timedelta(seconds=5),)),
    )
    writer = InlineWriter(ledger)
    sessions = MemorySessions(["agent:main:telegram:dm:9"])
    scheduler = ManualScheduler()
    swept: list[frozenset[str]] = []

    def sweep(now: Any = None, *, deliverable_platforms: Any = None) -> list[dict[str, Any]]:
        swept.append(frozenset(deliverable_platforms))
        return []

    adapter = ScriptedAdapter(script=[SendResult.failed(ErrorClass.REJECTED, "502")])

    async def main() -> None:
        gw = bootstrap.Gateway(
            ledger, writer=writer, sessions=sessions, sweep=sweep, scheduler=scheduler
        )
        async with gw:
            report = await gw.start([adapter])
            assert report.resumable_sessions == ("agent:main:telegram:dm:9",)
            assert swept == [frozenset({"telegram"})]
            out = await gw.deliver(CTX, Reply("hello"), "in-1")
            assert (out.status, out.error_class, out.retry_in) == ("failed", "rejected", 5.0)
            assert ledger.get(out.obligation_id).state == "failed"
            assert await scheduler.advance(5.0) == 1  # the retry: sent, delivered
            assert ledger.get(out.obligation_id).state == "delivered"
            assert [s.content for s in adapter.sent] == ["hello", "hello"]
            assert gw.stats().retries_scheduled == 1 and gw.stats().delivered == 1
        assert writer.closed

    asyncio.run(main())
    assert threading.active_count() == threads  # no writer thread, no heartbeat
