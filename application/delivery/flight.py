"""One reply's flight: record it, send each part, settle it, retry it.

The gateway (``gateway.py``) starts and stops; everything between a reply handed to
``deliver`` (or claimed by the boot sweep) and its settled obligation happens here, in a
:class:`Courier`: the record and ``Attempting`` as one durable point, the ownership
check before each hand-off (ADR 0032), each part sent and acknowledged in order, the
result written behind the send (ADR 0016), a failure settled and its retry scheduled,
a result that lost to a claim reported late (ADR 0010). A ledger fault never stops a
reply: it is logged with ids, counted, and the send goes ahead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.delivery.deadlines import Deadlines
from gateway_ledger.application.delivery.late_results import record_results, results_of
from gateway_ledger.application.delivery.ledger import DeliveryLedger
from gateway_ledger.application.delivery.ledger_ports import EventWriter, Written
from gateway_ledger.application.delivery.pacing import NO_WAIT, Pacer, Place
from gateway_ledger.application.delivery.ports import (
    PlatformAdapter,
    Reply,
    ReplyContext,
    SendResult,
    render_duplicate_notice,
)
from gateway_ledger.application.delivery.rate_limits import limits_of
from gateway_ledger.application.delivery.reconciliation import (
    DEFAULT_RECONCILE_DEADLINE,
    ReconcileQuery,
    Reconciler,
    can_reconcile,
    send_key,
    wants_key,
)
from gateway_ledger.application.delivery.recovery import load_for_sending
from gateway_ledger.application.delivery.scheduling import Scheduler
from gateway_ledger.application.observability import causes, tracing
from gateway_ledger.domain.delivery.marker import send_guard
from gateway_ledger.domain.delivery.obligation import DeliveryObligation, compute_obligation_id
from gateway_ledger.domain.delivery.ordering import WaitReason
from gateway_ledger.domain.errors import (
    ConcurrentUpdate,
    ConflictingRecord,
    LedgerError,
    NotFound,
    SessionErased,
)
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    ObligationState,
    OwnerIdentity,
    SendGuard,
)

log = logging.getLogger("gateway_ledger.gateway")

DEFAULT_RATE_LIMIT_WAIT = 1.0
"""When a platform says 429 without retry_after."""


@attrs.frozen
class OutgoingPart:
    index: int
    text: str
    media: MediaItem | None = None


def _guard_for(adapter: PlatformAdapter, may_have_arrived: bool) -> SendGuard:
    """The guard of a send through ``adapter``: its native key, or the marker if needed."""
    native = bool(getattr(adapter, "supports_idempotency", False))
    return send_guard(may_have_arrived=may_have_arrived, native_idempotency=native)


def outgoing_parts(agg: DeliveryObligation) -> list[OutgoingPart]:
    """Text chunks (or the whole content) first, then one part per media item."""
    texts = agg.parts or ([agg.content] if agg.content else [])
    parts = [OutgoingPart(i, t) for i, t in enumerate(texts)]
    if agg.media:
        parts += [OutgoingPart(len(texts) + i, m.caption or "", m) for i, m in enumerate(agg.media)]
    return parts


def unconfirmed_parts(agg: DeliveryObligation) -> list[OutgoingPart]:
    """The parts still to send, in order: those no confirmation was recorded for."""
    parts = outgoing_parts(agg)
    if not agg.delivered_parts:  # the usual case: nothing confirmed yet, nothing to filter
        return parts
    return [p for p in parts if not agg.part_delivered(p.index)]


@attrs.frozen
class DeliveryOutcome:
    """What ``deliver`` did. ``status``: delivered, failed (a retry is scheduled or the
    boot sweep owns it), abandoned, skipped (``skip_reason``), already_recorded (the same
    turn's reply is owed or done: nothing sent), queued (no adapter connected),
    superseded (another gateway claimed it mid-send: this one stopped sending), erased
    (the session was forgotten while the reply was on its way: neither recorded nor sent,
    or no more of it sent; ADR 0028), or unsendable (recovery found it unreadable:
    quarantined, never sent; ADR 0027)."""

    status: str
    obligation_id: str | None = None
    message_ids: tuple[str, ...] = ()
    error_class: str | None = None
    skip_reason: str | None = None
    ledger_fault: bool = False
    retry_in: float | None = None


@attrs.define(eq=False)
class RecordEnd:
    """Told on the loop if a reply's record write fails: ``deliver`` sets the wait, and
    the flight once the reply goes on. An object rather than a closure over the
    sender's locals, which would make each of them a cell for the reply's whole life."""

    courier: Courier
    oid: str
    waiter: asyncio.Future[None] | None = None
    flight: Flight | None = None

    def __call__(self, error: BaseException) -> None:
        """Within the deadline ``deliver`` saw the failure and counted it; after the
        deadline the reply went on as if tracked, so the failure is counted here (a
        ledger fault, and an untracked reply unless the id was recorded by another writer
        meanwhile), unless the reply was withheld because its session was forgotten,
        which is what refused the record (ADR 0073)."""
        waiter, flight, oid = self.waiter, self.flight, self.oid
        if waiter is None or waiter.cancelled() or not waiter.done():
            return
        if not isinstance(waiter.exception(), TimeoutError):
            return
        withheld = flight is not None and flight.erased and not flight.handed_off
        if withheld and isinstance(error, SessionErased):
            log.info("obligation %s: record refused, its session was erased; not sent", oid)
            return
        self.courier.fault(oid, "record after the deadline", error)
        if not isinstance(error, ConcurrentUpdate):
            self.courier.counters.untracked += 1


OWNER_PROVEN = "proven"
OWNER_SUPERSEDED = "superseded"
OWNER_UNPROVEN = "unproven"
OWNER_ERASED = "erased"


@attrs.define
class Counters:
    delivered: int = 0
    failed: int = 0
    abandoned: int = 0
    skipped: int = 0
    already_recorded: int = 0
    ledger_faults: int = 0
    recovered: int = 0
    retries_scheduled: int = 0
    rate_limit_waits: int = 0
    late_results: int = 0
    untracked: int = 0
    erased: int = 0
    status_reports: int = 0
    failed_after_acceptance: int = 0


@attrs.define
class Flight:
    """One obligation this gateway is sending, with its live aggregate."""

    agg: DeliveryObligation
    adapter: PlatformAdapter
    tracked: bool = True
    conflicted: bool = False
    erased: bool = False
    """Its session was forgotten while it was on its way: nothing more is sent."""
    last_write: Written | None = None
    runtime_retries: int = 0
    guard: SendGuard = SendGuard.NONE
    """What the next send does against an unannounced duplicate (recorded in Attempting)."""
    lease_epoch: int = 0
    """The heartbeat's lapse count when this gateway last proved it owns the obligation."""
    unproven: bool = False
    """A write of it timed out or failed: ownership is unproven until a write lands or a
    re-check against the store says so (ADR 0032)."""
    record_unconfirmed: bool = False
    """Its record timed out: the id may have been recorded before, by a gateway that
    delivered the same turn (a restart re-runs it), and then it is not sent again."""
    place: Place | None = None
    """Its place in its chat's queue (ADR 0065); None: not ordered (untracked)."""
    turn_taken: bool = False
    """It has waited for its turn once: retries and later parts do not wait again."""
    handed_off: int = 0
    """Parts handed to the platform by this flight (whatever their result)."""
    loop: asyncio.AbstractEventLoop | None = None
    """The loop its sender runs on, kept from its record's wait for its later writes
    (None: they ask for the running loop)."""

    @property
    def oid(self) -> str:
        return self.agg.obligation_id


class Courier:
    """Carries replies from their record to a settled obligation, one :class:`Flight`
    each. Owned by a ``Gateway``, which shares its connected ``adapters`` with it."""

    def __init__(
        self,
        ledger: DeliveryLedger,
        writer: EventWriter,
        scheduler: Scheduler,
        *,
        adapters: dict[str, PlatformAdapter],
        command_prefixes: Sequence[str],
        ledger_deadline: float,
        write_behind: bool,
        reconcile_deadline: float = DEFAULT_RECONCILE_DEADLINE,
    ) -> None:
        self.ledger = ledger
        self.writer = writer
        self.scheduler = scheduler
        self.adapters = adapters
        self.command_prefixes = command_prefixes
        self.deadlines = Deadlines(ledger_deadline)
        self.write_behind = write_behind
        """Write ``Delivered`` behind the send instead of waiting for it (ADR 0016)."""
        self.counters = Counters()
        self.reconciler = Reconciler(reconcile_deadline)
        """Asks reconciling adapters before a re-send (ADR 0050)."""
        self.background: set[asyncio.Task[None]] = set()
        """Late-result reports running detached (``flush`` waits for them)."""
        self.pacer = Pacer(
            order_wait=ledger.policy.order_wait.total_seconds(), recheck=self._still_unresolved
        )
        """Per-chat order and the rate budget of every send (ADR 0065)."""
        self.on_pause: Any = None
        """Told of a bot-wide ``retry_after`` (platform, seconds), to share it (ADR 0060)."""

    @property
    def command_prefixes(self) -> tuple[str, ...]:
        """Prefixes of an inbound message that make its reply a command's (not recorded)."""
        return self._command_prefixes

    @command_prefixes.setter
    def command_prefixes(self, prefixes: Sequence[str]) -> None:
        self._command_prefixes = tuple(prefixes)
        # "/" is a slash command (its own skip reason); the rest, one C call per reply.
        self._other_prefixes = tuple(p for p in self._command_prefixes if p != "/")

    @property
    def ledger_deadline(self) -> float:
        return self.deadlines.seconds

    @property
    def owner(self) -> OwnerIdentity:
        return self.ledger.owner

    @property
    def policy(self) -> LedgerPolicy:
        return self.ledger.policy

    def _now(self) -> datetime:
        return self.ledger.clock()

    async def settle_background(self) -> None:
        """Wait for the late-result reports still running."""
        while self.background:
            await asyncio.gather(*self.background, return_exceptions=True)

    def close(self) -> None:
        self.deadlines.close()

    def add_adapter(self, adapter: PlatformAdapter) -> None:
        """Its declared limits pace every send through it (ADR 0065)."""
        limits = limits_of(adapter)
        if limits.limited:
            self.pacer.add_platform(adapter.platform, limits)

    async def _still_unresolved(self, obligation_ids: list[str]) -> Collection[str]:
        """The store's word on other gateways' replies that hold a queue."""
        return await self.writer.read(self.ledger.unresolved_among, obligation_ids)

    def skip_reason(self, context: ReplyContext, reply: Reply) -> str | None:
        if (not reply.content or reply.content.isspace()) and not reply.media:
            return "empty"
        if reply.ephemeral:
            return "ephemeral"
        inbound = (context.inbound_text or "").lstrip()
        if inbound.startswith("/"):
            return "slash_command"
        if inbound.startswith(self._other_prefixes):
            return "command_prefix"
        return None

    async def deliver(
        self, context: ReplyContext, reply: Reply, inbound_message_id: str | None = None
    ) -> DeliveryOutcome:
        """The only way a final reply leaves the gateway."""
        reason = self.skip_reason(context, reply)
        if reason is not None:
            return await self._send_unrecorded(context, reply, inbound_message_id, reason)
        oid = compute_obligation_id(context.session_key, inbound_message_id or "", reply.content)
        try:
            return await self._deliver(oid, context, reply, inbound_message_id)
        except asyncio.CancelledError:
            self.pacer.park_id(oid)  # its sender was stopped: later replies need not wait
            raise

    async def _deliver(
        self, oid: str, context: ReplyContext, reply: Reply, inbound_message_id: str | None
    ) -> DeliveryOutcome:
        adapter = self.adapters.get(context.platform)
        place: Place | None = None
        # A new reply: nothing of it can have arrived yet.
        guard = SendGuard.NONE if adapter is None else _guard_for(adapter, False)
        try:
            agg = self.ledger.new_obligation(
                obligation_id=oid,
                session_key=context.session_key,
                platform=context.platform,
                chat_id=context.chat_id,
                thread_id=context.thread_id,
                content=reply.content,
                reply_to=inbound_message_id,
                media=reply.media,
                metadata=reply.metadata,
                parts=reply.parts,
            )
            # Nothing ahead in its chat and the budget free: recorded and attempting in
            # one commit. Else it is recorded alone and attempts when its turn comes.
            # An id with a place already is this turn's reply again (a restart re-runs a
            # turn): its record will be refused, and the place stays its first sender's.
            known = adapter is None or oid in self.pacer.places
            place = None if known else self.pacer.enter(oid, agg.target, agg.recorded_at)
            waits = place is not None and self.pacer.would_wait(place, agg.target)
            if adapter is not None and not waits:
                # The same instant as the record: both are decided here, in one commit.
                agg.start_attempt(by=self.owner, now=agg.recorded_at, guard=guard)
        except LedgerError as e:
            # Refused input is a ledger fault toward the gateway: the reply still goes out.
            if place is not None:
                self.pacer.leave(place)
            self.fault(oid, "record", e)
            if adapter is None:
                return DeliveryOutcome(status="failed", obligation_id=oid, ledger_fault=True)
            return await self._send_untracked(oid, context, reply, inbound_message_id, adapter)

        record_end = RecordEnd(self, oid)
        epoch = self.lease_epoch()
        future, waiter = self.writer.submit_waiting(
            agg.collect_events(), label=oid, on_error=record_end
        )
        record_end.waiter = waiter
        ended: BaseException | None = None  # how the record ended, as far as known now
        late = pending = False
        try:
            with tracing.span("record", obligation_id=oid, platform=context.platform):
                await self._durable(waiter)
        except Exception as e:
            ended = e
            if isinstance(e, TimeoutError):
                # The writer settles the write on its own thread: it may have ended since
                # the wait timed out. Then go on as it ended (a landed record is tracked, a
                # refused one is the same turn's reply recorded already), and leave any
                # failure to ``RecordEnd``, which counts what fails after the deadline.
                self.fault(oid, "record", e)
                late, pending = True, not future.done()  # looked at once: it may end any time
                if not pending:
                    ended = future.exception()
        if isinstance(ended, ConcurrentUpdate):
            if place is not None:
                self.pacer.leave(place)
            if await self._already_recorded(agg):
                return DeliveryOutcome(status="already_recorded", obligation_id=oid)
            if adapter is None:
                return DeliveryOutcome(status="failed", obligation_id=oid, ledger_fault=True)
            return await self._send_untracked(oid, context, reply, inbound_message_id, adapter)
        if isinstance(ended, SessionErased):
            if place is not None:
                self.pacer.leave(place)
            return self._erased(oid, "record")
        if ended is not None and not late:  # failed within the deadline: said and counted here
            self.fault(oid, "record", ended)
            self.counters.untracked += 1  # its record failed: nothing will recover it
        fault = late or ended is not None
        failed = ended is not None and not pending  # it did not land: nothing recovers it
        if adapter is None:
            log.info("obligation %s queued: platform %s not connected", oid, context.platform)
            return DeliveryOutcome(status="queued", obligation_id=oid, ledger_fault=fault)
        # After a timeout the commit may still land: later writes are chained after it.
        # A record that timed out may yet conflict with an earlier record of the same
        # turn: that is proven or disproven before the first hand-off (ADR 0073).
        flight = Flight(
            agg=agg,
            adapter=adapter,
            tracked=not failed,
            guard=guard,
            lease_epoch=epoch,
            unproven=pending,
            record_unconfirmed=pending,
            place=place,
            loop=waiter.get_loop(),
        )
        record_end.flight = flight
        flight.last_write = future
        if waits:
            outcome = await self._take_turn(flight, attempt=True)
            if outcome is not None:
                return self._settled(flight, outcome)
        return await self._send(flight)

    def _durable(self, waiter: asyncio.Future[None]) -> asyncio.Future[None]:
        """The write's future to await, failed with ``TimeoutError`` if the write has not
        ended within ``ledger_deadline``; the write itself goes on regardless. The future
        itself is awaited, not a coroutine around it: one object less per write."""
        self.deadlines.watch(waiter)
        return waiter

    def _erased(self, oid: str, stage: str) -> DeliveryOutcome:
        """The session was forgotten while this reply was on its way (ADR 0028).

        The user asked to be forgotten, and this reply was made from the conversation that
        was erased: it is not sent, as the erasure abandons every reply still owed. Nor is
        it recorded: there is no key left to seal it with, and clear text is what the
        erasure removed. Not a ledger fault: the ledger did what it must.
        """
        self.counters.erased += 1
        log.info("obligation %s not sent: its session was erased (%s)", oid, stage)
        return DeliveryOutcome(status="erased", obligation_id=oid)

    async def _already_recorded(self, agg: DeliveryObligation) -> bool:
        """The id is recorded already. True when it is the same record: that reply is owed
        or done, and it is not sent again. False when it is another reply under the same
        id (ConflictingRecord: a caller's bug): a ledger fault, and the caller sends this
        reply untracked, since a ledger fault never keeps a reply from the user."""
        oid = agg.obligation_id
        try:
            await self.writer.call(self.ledger.check_same_record, agg)
        except ConflictingRecord as e:
            self.fault(oid, "record", e)
            return False
        except Exception as e:
            self.fault(oid, "load", e)
        self.counters.already_recorded += 1
        log.info("obligation %s already recorded: not sent again", oid)
        return True

    async def _write(self, flight: Flight, stage: str) -> bool:
        """Save the flight's pending events; False (and a counted fault) if they did not land."""
        events = flight.agg.collect_events()
        if not flight.tracked:
            return False
        epoch = self.lease_epoch()
        future, waiter = self.writer.submit_waiting(
            events, label=flight.oid, after=flight.last_write, loop=flight.loop
        )
        flight.last_write = future
        try:
            with tracing.span("settle", obligation=flight.agg, stage=stage):
                await self._durable(waiter)
        except ConcurrentUpdate:
            # Another writer (an operator, a sweep) changed it: its history now decides.
            log.info("obligation %s: %s lost to a concurrent writer", flight.oid, stage)
            flight.tracked = False
            flight.conflicted = True
            await self._report_late(flight, events)
            return False
        except SessionErased:
            log.info("obligation %s: %s refused, its session was erased", flight.oid, stage)
            flight.tracked = False
            flight.erased = True
            return False
        except Exception as e:
            self.fault(flight.oid, stage, e)
            flight.unproven = True  # it may have lost to a claim: prove it before sending
            if not isinstance(e, TimeoutError):
                flight.tracked = False
            return False
        # Landed after everything before it: no claim came in between (optimistic check).
        flight.lease_epoch, flight.unproven, flight.record_unconfirmed = epoch, False, False
        return True

    def _write_later(self, flight: Flight, stage: str) -> None:
        """Save the flight's pending events without waiting: the reply is out already, and
        the next group commit carries them (ADR 0016). How the write ended is handled when
        it lands: a lost race still records the result as late, a failure is a fault."""
        events = flight.agg.collect_events()
        if not flight.tracked:
            return
        tracing.mark("settle", obligation=flight.agg, stage=stage)
        flight.last_write = self.writer.submit_behind(
            events,
            label=flight.oid,
            after=flight.last_write,
            on_error=functools.partial(self._not_landed, flight, stage, events),
            loop=flight.loop,
        )

    def _not_landed(
        self, flight: Flight, stage: str, events: Sequence[Any], error: BaseException
    ) -> None:
        """On the loop: a write behind the send did not land."""
        flight.tracked = False
        if isinstance(error, ConcurrentUpdate):
            log.info("obligation %s: %s lost to a concurrent writer", flight.oid, stage)
            flight.conflicted = True
            task = asyncio.get_running_loop().create_task(self._report_late(flight, events))
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        elif isinstance(error, SessionErased):
            # Already sent; its result is not recorded: the session was erased meanwhile.
            log.info("obligation %s: %s not recorded, its session was erased", flight.oid, stage)
        else:
            self.fault(flight.oid, stage, error)

    async def _report_late(self, flight: Flight, events: Sequence[Any]) -> None:
        """A result that lost to a claim is still a fact: record it late (ADR 0010)."""
        results = results_of(events)
        if not results:
            return
        try:
            late = await self.writer.call(record_results, self.ledger, flight.oid, results)
        except SessionErased:
            log.info("obligation %s: late result not recorded, session erased", flight.oid)
            return
        except Exception as e:
            self.fault(flight.oid, "late result", e)
            return
        self.counters.late_results += late

    async def _take_turn(self, flight: Flight, *, attempt: bool) -> DeliveryOutcome | None:
        """Wait for its turn in its chat and for the budget, then record why it waited,
        whom it goes before (durably, before the send it allows) and, for a reply not yet
        attempting, ``Attempting``. None: go on and send; else what stopped it."""
        flight.turn_taken = True
        agg = flight.agg
        turn = NO_WAIT if flight.place is None else await self.pacer.turn(flight.place)
        self._note_wait(flight, WaitReason.ORDER.value, turn.waited)
        for behind, why in turn.released:
            log.info("obligation %s goes before %s: order released (%s)", flight.oid, behind, why)
            self._apply(
                flight,
                agg.release_order,
                by=self.owner,
                now=self._now(),
                behind=behind,
                reason=why,
                waited=turn.waited,
            )
        if attempt:
            waited, held = await self.pacer.ready(agg.target)
            self._note_wait(flight, held, waited)
            flight.guard = _guard_for(flight.adapter, agg.may_have_arrived)
            self._apply(
                flight, agg.start_attempt, by=self.owner, now=self._now(), guard=flight.guard
            )
        if not (attempt or turn.released) or not agg.pending_events:
            return None
        await self._write(flight, "attempting" if attempt else "order released")
        if flight.erased:
            return self._erased(flight.oid, "turn")
        if flight.conflicted:
            return DeliveryOutcome(status="superseded", obligation_id=flight.oid)
        return None

    def _note_wait(self, flight: Flight, reason: str, seconds: float) -> None:
        """A wait worth recording (and measuring): written with the flight's next write."""
        if seconds <= 0 or not reason:
            return
        self.ledger.measures.paced_wait(reason, seconds)
        self._apply(
            flight,
            flight.agg.note_wait,
            by=self.owner,
            now=self._now(),
            reason=reason,
            seconds=seconds,
        )

    def _give_up_place(self, flight: Flight) -> None:
        """It will not be sent from here: resolved, or another writer's now."""
        if flight.place is not None:
            if flight.conflicted:
                self.pacer.hand_over(flight.place)
            else:
                self.pacer.leave(flight.place)

    def _settled(self, flight: Flight, outcome: DeliveryOutcome) -> DeliveryOutcome:
        """Its place in the queue after this outcome: gone when resolved or no longer this
        gateway's, held while a retry is scheduled, parked when left to a boot sweep."""
        place = flight.place
        if place is None:
            return outcome
        if outcome.status == "failed" and outcome.retry_in is not None:
            return outcome
        if outcome.status == "failed":
            self.pacer.park(place)
        elif outcome.status == "superseded" and flight.conflicted:
            self.pacer.hand_over(place)
        else:
            self.pacer.leave(place)
        return outcome

    async def _send(self, flight: Flight) -> DeliveryOutcome:
        """Send every unconfirmed part, in order, then settle the obligation."""
        if not flight.turn_taken:
            if flight.place is not None and self.pacer.holds(flight.place):
                stopped = await self._take_turn(flight, attempt=False)
                if stopped is not None:
                    return self._settled(flight, stopped)
            else:  # nothing holds its queue: its turn is now, with nothing to wait or record
                flight.turn_taken = True
        return self._settled(flight, await self._send_parts(flight))

    async def _send_parts(self, flight: Flight) -> DeliveryOutcome:
        agg, adapter = flight.agg, flight.adapter
        target = agg.target
        # A reconciling adapter gets the key too, to place on the message (ADR 0050).
        keyed = flight.guard is SendGuard.IDEMPOTENCY_KEY or wants_key(adapter)
        marker = flight.guard is SendGuard.MARKER
        parts = unconfirmed_parts(agg)
        single = agg.part_count <= 1
        receipt: list[str] = [i for ids in agg.delivered_parts.values() for i in ids]
        for n, part in enumerate(parts):
            # Parts go one at a time and each is confirmed before the next: only the first
            # unconfirmed part can have reached the user unconfirmed, so only it is marked.
            mark = marker and n == 0
            if self.pacer.paces(target):  # else nothing can hold it: nothing to ask
                waited, why = await self.pacer.ready(target)  # the budget first: owner after
                self._note_wait(flight, why, waited)
            if not self._owns(flight):
                verdict = await self._prove_owner(flight)
                if verdict == OWNER_ERASED:
                    return self._erased(flight.oid, f"before part {part.index}")
                if verdict == OWNER_SUPERSEDED and flight.record_unconfirmed:
                    self.counters.already_recorded += 1
                    log.info("obligation %s already recorded by another gateway", flight.oid)
                    return DeliveryOutcome(
                        status="already_recorded", obligation_id=flight.oid, ledger_fault=True
                    )
                if verdict == OWNER_SUPERSEDED:
                    log.info("obligation %s superseded before part %d", flight.oid, part.index)
                    return DeliveryOutcome(
                        status="superseded",
                        obligation_id=agg.obligation_id,
                        message_ids=tuple(receipt),
                    )
                # Unproven owner: never an unlabelled copy, and never a blocked send.
                mark = mark or verdict == OWNER_UNPROVEN
            text = render_duplicate_notice(adapter, part.text) if mark else part.text
            key = send_key(agg.obligation_id, part.index, single) if keyed else None
            # A claim that records its send spends its recovery attempt only now: after
            # every wait, holding the bot's turn, before the hand-off (ADR 0070).
            recovery = agg.claim_unsent
            start = functools.partial(self._start_recovery_send, flight) if recovery else None
            # The last await before the send: the instant it counts is the hand-off's.
            if self.pacer.paces(target):  # asked again: a pause may have come in meanwhile
                waited, why = await self.pacer.hand_off(target, under_way=n > 0, before=start)
                self._note_wait(flight, why, waited)
            elif start is not None:
                await start()
            if recovery and (flight.erased or flight.conflicted):
                return self._recovery_send_stopped(flight, receipt)
            flight.handed_off += 1
            with tracing.span("send", obligation=agg, part=part.index) as opened:
                result = await self._platform_send(adapter, target, text, part, agg, key)
                tracing.annotate(opened, error_class=result.error_class)
            if not result.success:
                return await self._settle_failure(flight, result)
            receipt.extend(result.message_ids)
            if n < len(parts) - 1:
                self._apply(
                    flight,
                    agg.acknowledge_part,
                    by=self.owner,
                    now=self._now(),
                    index=part.index,
                    receipt=result.message_ids,
                )
                await self._write(flight, f"part {part.index} delivered")
                if flight.erased:
                    return self._erased(flight.oid, f"after part {part.index}")
                if flight.conflicted:
                    # Claimed by another gateway mid-reply: fenced out, send no more parts.
                    log.info("obligation %s superseded after part %d", flight.oid, part.index)
                    return DeliveryOutcome(
                        status="superseded",
                        obligation_id=agg.obligation_id,
                        message_ids=tuple(receipt),
                    )
        self._apply(flight, agg.confirm_delivery, by=self.owner, now=self._now(), receipt=receipt)
        if self.write_behind:
            self._write_later(flight, "delivered")
        else:
            await self._write(flight, "delivered")
        self.counters.delivered += 1
        return DeliveryOutcome(
            status="delivered",
            obligation_id=agg.obligation_id,
            message_ids=tuple(receipt),
            ledger_fault=not flight.tracked,
        )

    async def _start_recovery_send(self, flight: Flight) -> None:
        """Record that the send of a reply claimed with ``records_send`` starts: only now
        does the claim spend a recovery attempt (ADR 0070). A write that does not land
        is a fault, and the send goes on, as every send does on a fault."""
        self._apply(flight, flight.agg.start_recovery_send, by=self.owner, now=self._now())
        await self._write(flight, "recovery send")

    def _recovery_send_stopped(self, flight: Flight, receipt: list[str]) -> DeliveryOutcome:
        """The recovery send's record did not land: the session was erased meanwhile, or
        another writer (an operator, a sweep) took the obligation; nothing is sent."""
        if flight.erased:
            return self._erased(flight.oid, "recovery send")
        log.info("obligation %s superseded before its recovery send", flight.oid)
        return DeliveryOutcome(
            status="superseded", obligation_id=flight.agg.obligation_id, message_ids=tuple(receipt)
        )

    def lease_epoch(self) -> int:
        heartbeat = self.ledger.heartbeat
        return 0 if heartbeat is None else heartbeat.lapses

    def _owns(self, flight: Flight) -> bool:
        """May this hand-off go out as the owner's, with no store round trip? (ADR 0032)

        No write of the flight (its record included) may have timed out or failed since
        it was last proven. Without a lease (SQLite: liveness is /proc) that is all. With
        one, the lease must also be provably held a renewal period longer, and not have
        lapsed since the flight's ownership was last proven.
        """
        if flight.unproven:
            return False
        heartbeat = self.ledger.heartbeat
        if heartbeat is None:
            return True
        return flight.lease_epoch == heartbeat.lapses and heartbeat.holds(
            heartbeat.settings.renew_every
        )

    async def _prove_owner(self, flight: Flight) -> str:
        """Renew the lease and re-read the obligation: still ours (proven), taken by a claim
        or settled by another writer (superseded), not recorded and its session forgotten
        since the reply was made (erased: its record will be refused, ADR 0073), or
        unknowable now (unproven: the store is down or slower than ``ledger_deadline``; a
        ledger fault). The read does not wait for this gateway's own writes still queued:
        they change neither owner nor fence."""
        heartbeat = self.ledger.heartbeat
        oid = flight.oid
        agg = flight.agg

        def check() -> tuple[int, Any, bool]:
            if heartbeat is not None:
                heartbeat.renew()
            epoch = self.lease_epoch()
            try:
                return epoch, self.ledger.get(oid), False
            except NotFound:
                # Not recorded: nobody else can own it. Its record may still be on its
                # way, and refused if the session was forgotten since the reply was made.
                forgotten = self.ledger.forgotten_since(agg.session_key, agg.recorded_at)
                return epoch, None, forgotten

        try:
            epoch, stored, forgotten = await asyncio.wait_for(
                self.writer.read(check), timeout=self.ledger_deadline
            )
        except Exception as e:
            self.fault(oid, "ownership check", e)
            return OWNER_UNPROVEN
        if forgotten:
            flight.tracked = False
            flight.erased = True
            return OWNER_ERASED
        if stored is not None and (
            stored.owner != self.owner
            or stored.fence != flight.agg.fence
            or ObligationState(stored.state).is_final
        ):
            log.info("obligation %s: another owner or writer took it (fence %d)", oid, stored.fence)
            flight.tracked = False
            flight.conflicted = True
            return OWNER_SUPERSEDED
        flight.lease_epoch, flight.unproven, flight.record_unconfirmed = epoch, False, False
        return OWNER_PROVEN

    def _apply(self, flight: Flight, command: Callable[..., object], **arguments: Any) -> None:
        """Run a domain command on the live aggregate; a refusal is a ledger fault, not a stop.
        The command and its arguments are passed, not a closure over them: a closure's
        captured names are cells that live as long as the sender's frame (collector work
        on every reply)."""
        try:
            command(**arguments)
        except LedgerError as e:
            self.fault(flight.oid, "transition", e)
            flight.tracked = False

    async def _platform_send(
        self,
        adapter: PlatformAdapter,
        target: DeliveryTarget,
        text: str,
        part: OutgoingPart,
        agg: DeliveryObligation,
        key: str | None,
    ) -> SendResult:
        try:
            result = await adapter.send(
                target,
                text,
                reply_to=target.reply_to,
                media=(part.media,) if part.media is not None else (),
                metadata=agg.metadata,
                idempotency_key=key,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Raised after the request may have left (timeout, reset): it may have arrived.
            return SendResult.failed(ErrorClass.AMBIGUOUS, type(e).__name__)
        finally:
            self.pacer.answered(target)
        if not isinstance(result, SendResult):
            return SendResult.failed(ErrorClass.AMBIGUOUS, "adapter returned no SendResult")
        return result

    async def _settle_failure(self, flight: Flight, result: SendResult) -> DeliveryOutcome:
        agg = flight.agg
        error_class = result.error_class or ErrorClass.AMBIGUOUS
        retry_after = result.retry_after
        now = self._now()
        if error_class is ErrorClass.RATE_LIMITED:
            self._pause(agg.target, result.retry_scope, retry_after)
        self._apply(
            flight,
            agg.fail,
            by=self.owner,
            now=now,
            error=result.error,
            classification=error_class,
            retry_after=retry_after,
        )
        log.info(
            "obligation %s send failed: %s attempt=%d",
            agg.obligation_id,
            error_class.value,
            agg.send_attempts,
        )
        if error_class is ErrorClass.DEAD_TARGET:
            self._apply(
                flight,
                agg.abandon,
                reason=AbandonReason.DEAD_TARGET,
                now=now,
                by=self.owner,
                detail=result.error,
            )
            await self._write(flight, "abandoned")
            self.counters.abandoned += 1
            return DeliveryOutcome(
                status="abandoned",
                obligation_id=agg.obligation_id,
                error_class=error_class.value,
            )
        await self._write(flight, "failed")
        self.counters.failed += 1
        delay = (
            None
            if flight.conflicted or flight.erased
            else self._retry_delay(flight, error_class, retry_after)
        )
        if delay is not None:
            self.ledger.measures.waited(
                "rate_limit" if error_class is ErrorClass.RATE_LIMITED else "backoff", delay
            )
            self.counters.retries_scheduled += 1
            self.scheduler.schedule(
                delay, lambda: self._retry(flight), label=f"retry {agg.obligation_id}"
            )
        else:
            log.info("obligation %s: runtime retries spent; left to the boot sweep", flight.oid)
        return DeliveryOutcome(
            status="failed",
            obligation_id=agg.obligation_id,
            error_class=error_class.value,
            ledger_fault=not flight.tracked,
            retry_in=delay,
        )

    def _rate_limit_wait(self, retry_after: float | None) -> float:
        """How long a 429 holds its scope: what the platform said, within the policy's cap."""
        wait = DEFAULT_RATE_LIMIT_WAIT if retry_after is None else retry_after
        return min(max(0.0, wait), self.policy.max_retry_after.total_seconds())

    def _pause(self, target: DeliveryTarget, scope: str, retry_after: float | None) -> None:
        """A platform's 429 holds every sender of its scope, not just this reply (ADR 0065);
        a bot-wide one is shared with the store's other gateways (ADR 0060)."""
        seconds = self._rate_limit_wait(retry_after)
        self.pacer.pause(target, scope, seconds)
        if scope == "bot" and self.on_pause is not None:
            self.on_pause(target.platform, seconds)

    def _retry_delay(
        self, flight: Flight, error_class: ErrorClass, retry_after: float | None
    ) -> float | None:
        if error_class is ErrorClass.RATE_LIMITED:
            # Waiting out a rate limit is not an attempt: the budget below is untouched.
            self.counters.rate_limit_waits += 1
            return self._rate_limit_wait(retry_after)
        backoff = self.policy.retry_backoff
        if flight.runtime_retries >= len(backoff):
            return None
        delay = backoff[flight.runtime_retries].total_seconds()
        flight.runtime_retries += 1
        return delay

    async def _retry(self, flight: Flight) -> None:
        agg = flight.agg
        if flight.conflicted or flight.erased:
            log.info("obligation %s not retried: another writer took it", flight.oid)
            self._give_up_place(flight)
            return
        if flight.tracked:
            # Asked once per ambiguous failure: a rate limit's wait after it asks nothing.
            ambiguous = agg.error_class is ErrorClass.AMBIGUOUS
            if ambiguous and await self._settled_by_platform(flight):
                self._give_up_place(flight)
                return
            if flight.conflicted or flight.erased:
                self._give_up_place(flight)
                return
            if agg.error_class is ErrorClass.RATE_LIMITED:
                self.pacer.resume(agg.target)  # its retry_after is over: the scope goes on
            waited, why = await self.pacer.ready(agg.target)  # the budget before Attempting
            self._note_wait(flight, why, waited)
            flight.guard = _guard_for(flight.adapter, agg.may_have_arrived)
            try:
                agg.start_attempt(by=self.owner, now=self._now(), guard=flight.guard)
            except LedgerError as e:
                log.info("obligation %s not retried: %s", flight.oid, type(e).__name__)
                self._give_up_place(flight)
                return
            if not await self._write(flight, "attempting") and (flight.conflicted or flight.erased):
                if flight.erased:
                    self._erased(flight.oid, "retry")
                self._give_up_place(flight)
                return
        else:
            # Untracked: its history here may be behind the store's, so assume an earlier
            # send may have arrived (the aggregate is not touched: nothing records this).
            flight.guard = _guard_for(flight.adapter, True)
        try:
            await self._send(flight)
        except Exception as e:  # a retry runs detached: never let it die silently
            log.error("obligation %s retry crashed: %s", flight.oid, type(e).__name__)

    # -- recovery -----------------------------------------------------------------------------

    async def recover(self, item: Mapping[str, Any], lease_epoch: int = 0) -> DeliveryOutcome:
        """Re-send one claimed obligation (``prepare_recovery`` then ``send_recovered``)."""
        return await self.send_recovered(await self.prepare_recovery(item, lease_epoch))

    async def prepare_recovery(
        self, item: Mapping[str, Any], lease_epoch: int = 0
    ) -> Flight | DeliveryOutcome:
        """Load a claimed obligation for sending and take its place in its chat's queue,
        by when it was recorded: a boot prepares every claim before sending any, so the
        recovered replies to one chat go in their order, and before its new replies."""
        oid = str(item["obligation_id"])
        adapter = self.adapters.get(str(item["platform"]))
        try:
            # Read again, each field opened: what cannot be opened is never sent (ADR 0027).
            agg, problem = await self.writer.call(load_for_sending, self.ledger, oid)
        except Exception as e:
            self.fault(oid, "load", e)
            return DeliveryOutcome(status="failed", obligation_id=oid, ledger_fault=True)
        if agg is None:
            assert problem is not None
            if problem.abandon is not None:
                self.counters.abandoned += 1
                return DeliveryOutcome(status="abandoned", obligation_id=oid)
            return DeliveryOutcome(status="unsendable", obligation_id=oid)
        if adapter is None or agg.state is not ObligationState.CLAIMED or agg.owner != self.owner:
            return DeliveryOutcome(status="failed", obligation_id=oid)
        self.counters.recovered += 1
        place = self.pacer.enter(oid, agg.target, agg.recorded_at)
        self.pacer.claimed(place)
        return Flight(agg=agg, adapter=adapter, lease_epoch=lease_epoch, place=place)

    async def send_recovered(self, prepared: Flight | DeliveryOutcome) -> DeliveryOutcome:
        if isinstance(prepared, DeliveryOutcome):
            return prepared
        try:
            return await self._send_recovered(prepared)
        except asyncio.CancelledError:
            self.pacer.park_id(prepared.oid)
            raise

    async def _send_recovered(self, prepared: Flight) -> DeliveryOutcome:
        flight, oid = prepared, prepared.oid
        agg = flight.agg
        with (
            tracing.span("recover", obligation=agg) as opened,
            causes.caused_by(f"recovery:{oid}"),
        ):
            outcome = await self._recover(flight)
            tracing.annotate(opened, status=outcome.status)
        return outcome

    async def _recover(self, flight: Flight) -> DeliveryOutcome:
        """A claimed obligation: settled by the platform's answer, or sent (ADR 0050)."""
        agg, oid = flight.agg, flight.oid
        if await self._settled_by_platform(flight):
            return self._settled(
                flight,
                DeliveryOutcome(
                    status="delivered", obligation_id=oid, message_ids=tuple(agg.receipt)
                ),
            )
        if flight.conflicted or flight.erased:
            return self._settled(flight, DeliveryOutcome(status="superseded", obligation_id=oid))
        log.info("obligation %s recovered marker=%s", oid, agg.arrived_before_this_send)
        # As Claimed decided, or as the platform's answer since then struck it off.
        flight.guard = _guard_for(flight.adapter, agg.arrived_before_this_send)
        return await self._send(flight)

    # -- reconciliation and statuses after acceptance (ADR 0050) -------------------------------

    async def report_status(
        self,
        obligation_id: str,
        status: str,
        at: datetime | None = None,
        detail: str = "",
        message_id: str | None = None,
    ) -> bool:
        """A platform's status callback: recorded in order (False: a late or repeated one,
        nothing changed). A failure after acceptance reopens the obligation and, with its
        platform connected, schedules its re-send as a failed send's retry would be."""
        await self.writer.flush()  # its Delivered, written behind the send, lands first
        recorded, agg = await self.writer.call(
            self.ledger.record_status, obligation_id, status, at, detail, message_id
        )
        if not recorded:
            return False
        self.counters.status_reports += 1
        if agg.state is not ObligationState.FAILED:
            return True
        self.counters.failed_after_acceptance += 1
        log.info("obligation %s failed after the platform accepted it: reopened", obligation_id)
        adapter = self.adapters.get(agg.platform)
        if adapter is None or agg.owner != self.owner:
            return True  # the boot sweep of a gateway with that platform re-sends it
        # The runtime backoff is spent across reopenings: a platform that keeps dropping
        # it leaves it to the boot sweep, whose recovery budget then applies.
        flight = Flight(
            agg=agg,
            adapter=adapter,
            lease_epoch=self.lease_epoch(),
            runtime_retries=agg.failures_after_acceptance - 1,
        )
        delay = self._retry_delay(flight, ErrorClass.REJECTED, None)
        if delay is not None:
            self.counters.retries_scheduled += 1
            self.scheduler.schedule(
                delay, lambda: self._retry(flight), label=f"retry {agg.obligation_id}"
            )
        return True

    # -- reconciliation (ADR 0050) ------------------------------------------------------------

    async def _settled_by_platform(self, flight: Flight) -> bool:
        """Before a re-send that may duplicate: ask the platform, once, what arrived, and
        record its answer. True when it arrived (the obligation is now ``Delivered``, no
        re-send); else the re-send goes on, plain after ``not_arrived``. Nothing is asked
        when no earlier send may have arrived or the adapter cannot reconcile."""
        agg, adapter = flight.agg, flight.adapter
        pending_send = agg.state is ObligationState.CLAIMED
        due = agg.arrived_before_this_send if pending_send else agg.may_have_arrived
        if not due or not can_reconcile(adapter):
            return False
        single = agg.part_count <= 1
        unconfirmed = [p.index for p in unconfirmed_parts(agg)]
        if not unconfirmed:
            return False
        first = unconfirmed[0]
        query = ReconcileQuery(
            obligation_id=agg.obligation_id,
            target=agg.target,
            key=send_key(agg.obligation_id, first, single),
            part=None if single else first,
            since=agg.recorded_at,
            until=self._now(),
        )
        known = {i for ids in agg.delivered_parts.values() for i in ids}
        stage = "claim" if pending_send else "retry"
        with tracing.span("reconcile", obligation=agg, stage=stage) as opened:
            answer = await self.reconciler.ask(adapter, query, known)
            tracing.annotate(opened, status=answer.outcome.value)
        try:
            agg.reconcile(
                by=self.owner,
                now=self._now(),
                outcome=answer.outcome,
                evidence=answer.evidence,
                message_ids=answer.message_ids,
                part=query.part,
            )
        except LedgerError as e:
            # Not recordable (refused by the obligation): as unknown, the send goes on.
            self.fault(flight.oid, "reconciled", e)
            return False
        await self._write(flight, "reconciled")
        if agg.state is ObligationState.DELIVERED and not (flight.conflicted or flight.erased):
            self.counters.delivered += 1
            log.info("obligation %s arrived already: settled, not re-sent", flight.oid)
            return True
        return False

    # -- unrecorded sends ---------------------------------------------------------------------

    async def _send_unrecorded(
        self,
        context: ReplyContext,
        reply: Reply,
        inbound_message_id: str | None,
        reason: str,
    ) -> DeliveryOutcome:
        """Commands, ephemeral replies: sent as upstream does, without an obligation."""
        self.counters.skipped += 1
        if reason == "empty":
            return DeliveryOutcome(status="skipped", skip_reason=reason)
        adapter = self.adapters.get(context.platform)
        if adapter is None:
            return DeliveryOutcome(status="skipped", skip_reason=reason)
        target = DeliveryTarget(
            platform=context.platform,
            chat_id=context.chat_id,
            thread_id=context.thread_id,
            reply_to=inbound_message_id,
        )
        result = await self._send_whole(adapter, target, reply)
        return DeliveryOutcome(
            status="skipped",
            skip_reason=reason,
            message_ids=result.message_ids,
            error_class=result.error_class.value if result.error_class else None,
        )

    async def _send_untracked(
        self,
        oid: str,
        context: ReplyContext,
        reply: Reply,
        inbound_message_id: str | None,
        adapter: PlatformAdapter,
    ) -> DeliveryOutcome:
        """The ledger refused the reply: send it anyway, once, and say so."""
        self.counters.untracked += 1
        target = DeliveryTarget(
            platform=context.platform,
            chat_id=context.chat_id,
            thread_id=context.thread_id,
            reply_to=inbound_message_id,
        )
        try:
            result = await self._send_whole(adapter, target, reply)
        except Exception as e:
            result = SendResult.failed(ErrorClass.AMBIGUOUS, type(e).__name__)
        status = "delivered" if result.success else "failed"
        if result.success:
            self.counters.delivered += 1
        else:
            self.counters.failed += 1
        return DeliveryOutcome(
            status=status,
            obligation_id=oid,
            message_ids=result.message_ids,
            error_class=result.error_class.value if result.error_class else None,
            ledger_fault=True,
        )

    async def _send_whole(
        self, adapter: PlatformAdapter, target: DeliveryTarget, reply: Reply
    ) -> SendResult:
        """A reply sent in one request outside any obligation (a command's, or one the
        ledger refused): within the platform's budget, and counted from when it came
        back, like every send; what the adapter raises is raised."""
        await self.pacer.hand_off(target)
        try:
            return await adapter.send(
                target,
                reply.content,
                reply_to=target.reply_to,
                media=reply.media,
                metadata=dict(reply.metadata),
                idempotency_key=None,
            )
        finally:
            self.pacer.answered(target)

    def fault(self, oid: str, stage: str, error: BaseException) -> None:
        self.counters.ledger_faults += 1
        error_class = type(error).__name__
        log.warning(
            "ledger fault obligation=%s stage=%s error=%s",
            oid,
            stage,
            error_class,
            extra={"obligation_id": oid, "stage": stage, "error_class": error_class},
        )
