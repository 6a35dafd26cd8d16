"""The gateway's lifecycle: start (connect, recover, resume), stop, and its figures.

``await gateway.start(adapters)``
    connect, sweep with the connected platforms, re-send what this gateway claimed,
    clear those sessions' resume flags, and only then report what may resume.
``await gateway.deliver(context, reply, inbound_message_id)``
    the one delivery path: record + attempting (one durable point) -> send each part ->
    delivered | failed. One reply's flight is :mod:`.flight`'s (``Courier``).

Store work never runs on the event loop: events are built on it (pure CPU) and handed
to the writer (``EventWriter``, the group-commit writer once wired by ``bootstrap.py``).
A ledger fault (locked, full, corrupt database, or a commit slower than
``ledger_deadline``) never stops a reply: it is logged with ids, counted in
``stats().ledger_faults``, and the send goes ahead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.delivery.flight import Courier, DeliveryOutcome
from gateway_ledger.application.delivery.ledger import DeliveryLedger
from gateway_ledger.application.delivery.ledger_ports import EventWriter
from gateway_ledger.application.delivery.pacing import PacingStats, SharedBudget
from gateway_ledger.application.delivery.ports import PlatformAdapter, Reply, ReplyContext
from gateway_ledger.application.delivery.reconciliation import DEFAULT_RECONCILE_DEADLINE
from gateway_ledger.application.delivery.recovery_port import RecoverySweep, ResumableSessions
from gateway_ledger.application.delivery.scheduling import AsyncioScheduler, Scheduler
from gateway_ledger.application.observability import causes, tracing
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity

log = logging.getLogger("gateway_ledger.gateway")

DEFAULT_COMMAND_PREFIXES = ("/", "!")
DEFAULT_SHARE_PERIOD = 1.0
"""Seconds between two renewals of this gateway's share of its bots' budgets (ADR 0060)."""
DEFAULT_LEDGER_DEADLINE = 2.0
"""Seconds a send waits for its obligation to be durable before going out anyway."""

RECOVERY_COMPLETE = "complete"
RECOVERY_PARTIAL = "partial"
RECOVERY_NOT_RUN = "not_run"


@attrs.frozen
class StartReport:
    """What ``start`` recovered. ``recovery``: ``complete``; ``partial`` when something
    owed was left unrecovered (quarantined, unreadable, or a ledger fault on one
    obligation: ``quarantined`` counts the first kinds); ``not_run`` when the sweep itself
    failed, so nothing was recovered (ADR 0027). Both are logged at ERROR."""

    connected: tuple[str, ...]
    claimed: int
    redelivered: int
    failed: int
    resumable_sessions: tuple[str, ...]
    ledger_available: bool = True
    """False when the start check found that nothing can be recorded (wrong or missing
    master key, read-only store, ...): every reply goes out untracked, and recovery did
    not run. Also logged at ERROR."""
    ledger_problem: str | None = None
    """What the start check hit (the error's class and first line), when unavailable."""
    recovery: str = RECOVERY_COMPLETE
    quarantined: int = 0


@attrs.frozen
class GatewayStats:
    delivered: int
    failed: int
    abandoned: int
    skipped: int
    already_recorded: int
    ledger_faults: int
    recovered: int
    retries_scheduled: int
    rate_limit_waits: int
    commits: int
    events: int
    largest_group: int
    group_conflicts: int
    late_results: int = 0
    untracked: int = 0
    """Replies sent (or queued) without a durable obligation: the ledger refused or lost
    their record (a ledger fault each), so no crash recovery covers them."""
    erased: int = 0
    """Replies not sent (or not finished) because their session was erased meanwhile."""
    reconciled_arrived: int = 0
    """Re-sends not made: the platform said the reply had arrived (ADR 0050)."""
    reconciled_not_arrived: int = 0
    reconciled_unknown: int = 0
    reconcile_bad_answers: int = 0
    """Reconciliations that raised, came too late or made no sense (counted as unknown)."""
    status_reports: int = 0
    failed_after_acceptance: int = 0
    pacing: PacingStats | None = None
    """Replies waiting for their turn or the rate budget by platform, the oldest wait,
    the pauses in force (ADR 0065)."""


class Gateway:
    """Embeds the ledger in an asyncio gateway. One instance per process.

    ``writer`` saves the gateway's events off the loop; the public ``Gateway``
    (``bootstrap.py``) gives it the group-commit writer by default.
    """

    def __init__(
        self,
        ledger: DeliveryLedger,
        *,
        writer: EventWriter,
        sessions: ResumableSessions | None = None,
        sweep: RecoverySweep | None = None,
        scheduler: Scheduler | None = None,
        command_prefixes: Sequence[str] = DEFAULT_COMMAND_PREFIXES,
        ledger_deadline: float = DEFAULT_LEDGER_DEADLINE,
        write_behind: bool = True,
        reconcile_deadline: float = DEFAULT_RECONCILE_DEADLINE,
        budget: SharedBudget | None = None,
        share_period: float = DEFAULT_SHARE_PERIOD,
    ) -> None:
        self.ledger = ledger
        self.budget = budget
        self.share_period = share_period
        self._sharing: asyncio.Task[None] | None = None
        self.sessions = sessions
        self.scheduler: Scheduler = scheduler or AsyncioScheduler()
        self.writer = writer
        self._sweep = sweep or ledger.sweep_recoverable
        self._adapters: dict[str, PlatformAdapter] = {}
        self._courier = Courier(
            ledger,
            writer,
            self.scheduler,
            adapters=self._adapters,
            command_prefixes=command_prefixes,
            ledger_deadline=ledger_deadline,
            write_behind=write_behind,
            reconcile_deadline=reconcile_deadline,
        )
        self._closed = False
        self._courier.on_pause = self._share_pause

    @property
    def ledger_deadline(self) -> float:
        """Seconds a send waits for its ledger write before going out anyway."""
        return self._courier.deadlines.seconds

    @ledger_deadline.setter
    def ledger_deadline(self, seconds: float) -> None:
        self._courier.deadlines.seconds = seconds

    @property
    def command_prefixes(self) -> tuple[str, ...]:
        """Inbound prefixes of commands, whose replies skip the ledger (like upstream)."""
        return self._courier.command_prefixes

    @command_prefixes.setter
    def command_prefixes(self, prefixes: Sequence[str]) -> None:
        self._courier.command_prefixes = tuple(prefixes)

    @property
    def write_behind(self) -> bool:
        """Write ``Delivered`` behind the send instead of waiting for it (ADR 0016)."""
        return self._courier.write_behind

    @write_behind.setter
    def write_behind(self, value: bool) -> None:
        self._courier.write_behind = value

    @property
    def owner(self) -> OwnerIdentity:
        return self.ledger.owner

    @property
    def policy(self) -> LedgerPolicy:
        return self.ledger.policy

    def _now(self) -> datetime:
        return self.ledger.clock()

    # -- lifecycle ----------------------------------------------------------------------------

    def add_adapter(self, adapter: PlatformAdapter) -> None:
        self._adapters[adapter.platform] = adapter
        self._courier.add_adapter(adapter)
        attach = getattr(adapter, "attach_status_sink", None)
        if callable(attach):  # the status-callback hook (ADR 0050)
            attach(self.report_status)

    async def start(self, adapters: Iterable[PlatformAdapter] = ()) -> StartReport:
        """Connect, recover what dead gateways owed, then say which sessions may resume."""
        connected: list[str] = []
        for adapter in adapters:
            connect = getattr(adapter, "connect", None)
            try:
                if connect is not None:
                    await connect()
            except Exception as e:
                log.warning("platform %s did not connect: %s", adapter.platform, type(e).__name__)
                continue
            self.add_adapter(adapter)
            connected.append(adapter.platform)
        platforms = frozenset(self._adapters)
        self._courier.pacer.begin()
        problem = await self._check_ledger()
        if problem is None:
            await self._join_budgets()
        recovery = RECOVERY_COMPLETE if problem is None else RECOVERY_NOT_RUN
        quarantined = 0
        claimed: list[dict[str, Any]] = []
        swept = None
        epoch = self._courier.lease_epoch()  # the claims below are proven as of this lease epoch
        if problem is None:
            try:
                claimed, swept = await self.writer.call(self._run_sweep, platforms)
            except Exception as e:
                self._courier.fault("-", "sweep", e)
                recovery = RECOVERY_NOT_RUN
        if swept is not None:
            quarantined = swept.quarantined
            if swept.quarantined or swept.errors:
                recovery = RECOVERY_PARTIAL
        # Every claim takes its place in its chat's queue before any is sent (ADR 0065).
        prepared = await asyncio.gather(
            *(self._courier.prepare_recovery(item, epoch) for item in claimed)
        )
        if problem is None:
            await self._load_others_replies(platforms)
        outcomes = await asyncio.gather(*(self._courier.send_recovered(p) for p in prepared))
        unsent = sum(1 for o in outcomes if o.status == "unsendable")
        if unsent:
            quarantined += unsent
            recovery = RECOVERY_PARTIAL if recovery == RECOVERY_COMPLETE else recovery
        redelivered = sum(1 for o in outcomes if o.status == "delivered")
        if self.sessions is not None:
            now = self._now()
            for key in sorted({str(item["session_key"]) for item in claimed}):
                try:
                    await self.writer.call(self.sessions.clear_resume, key, now)
                except Exception as e:
                    self._courier.fault("-", "clear_resume", e)
            try:
                resumable = tuple(await self.writer.call(self.sessions.pending_resumes, now))
            except Exception as e:
                self._courier.fault("-", "pending_resumes", e)
                resumable = ()
        else:
            resumable = ()
        log.info(
            "gateway started: platforms=%d claimed=%d redelivered=%d recovery=%s",
            len(connected),
            len(claimed),
            redelivered,
            recovery,
        )
        if recovery == RECOVERY_NOT_RUN:
            log.error("gateway started WITHOUT recovery: the sweep failed; nothing recovered")
        elif recovery == RECOVERY_PARTIAL:
            log.error(
                "gateway started with PARTIAL recovery: %d obligation(s) quarantined or "
                "unreadable, %d sweep error(s); see gateway-ledger list --state quarantined",
                quarantined,
                0 if swept is None else swept.errors,
            )
        return StartReport(
            connected=tuple(connected),
            claimed=len(claimed),
            redelivered=redelivered,
            failed=sum(1 for o in outcomes if o.status == "failed"),
            resumable_sessions=resumable,
            ledger_available=problem is None,
            ledger_problem=problem,
            recovery=recovery,
            quarantined=quarantined,
        )

    async def _join_budgets(self) -> None:
        """Take this gateway's share of each limited bot, and keep it (ADR 0060). Where
        other gateways already send, this one waits a period first, so that each has
        made room for it before it sends."""
        pacer = self._courier.pacer
        platforms = pacer.shared_platforms()
        if self.budget is None or not platforms:
            return
        try:
            shares = await self._renew_shares(platforms)
        except Exception as e:
            self._courier.fault("-", "budget", e)
            shares = {}
        for platform, gateways in shares.items():
            if gateways > 1:
                pacer.pause_bot(platform, self.share_period)
        self._sharing = asyncio.get_running_loop().create_task(self._keep_shares(platforms))

    async def _renew_shares(self, platforms: list[str]) -> Mapping[str, int]:
        assert self.budget is not None
        shares, pauses = await self.writer.call(
            self.budget.renew, self.owner, platforms, 3 * self.share_period
        )
        pacer = self._courier.pacer
        for platform, gateways in shares.items():
            pacer.share(platform, gateways)
        for platform, seconds in pauses.items():
            pacer.pause_bot(platform, seconds)
        return shares

    async def _keep_shares(self, platforms: list[str]) -> None:
        while True:
            await asyncio.sleep(self.share_period)
            try:
                await self._renew_shares(platforms)
            except Exception as e:  # kept at the last share; the next renewal tries again
                self._courier.fault("-", "budget", e)

    def _share_pause(self, platform: str, seconds: float) -> None:
        """A bot-wide pause, told to the store's other gateways (in the background)."""
        if self.budget is None:
            return
        budget = self.budget

        async def tell() -> None:
            try:
                await self.writer.call(budget.pause, platform, seconds)
            except Exception as e:  # the pause still holds this gateway; counted, logged
                self._courier.fault("-", "budget", e)

        task = asyncio.get_running_loop().create_task(tell())
        self._courier.background.add(task)
        task.add_done_callback(self._courier.background.discard)

    async def _load_others_replies(self, platforms: frozenset[str]) -> None:
        """Replies other gateways of the store still owe hold their chats' queues here
        too, until the store says they are resolved (ADR 0065)."""
        try:
            others = await self.writer.call(self.ledger.others_unresolved, platforms)
        except Exception as e:
            self._courier.fault("-", "order", e)
            return
        added = self._courier.pacer.load_foreign(others)
        if added:
            log.info("%d replies owed by other gateways hold their chats' order", added)

    async def _check_ledger(self) -> str | None:
        """Can this gateway record at all? None if so, else what stops it (logged at ERROR).

        A wrong or missing master key or a read-only store opens and reads fine; without
        this check each reply would find it alone, as one more warning. The gateway still
        starts and sends (a ledger fault never blocks a reply), but it does not sweep: a
        claim it could not follow with a send would only spend a recovery attempt.
        """
        try:
            await self.writer.call(self.ledger.start)  # its lease, if not started yet
            await self.writer.call(self.ledger.check_writable)
        except Exception as e:
            self._courier.counters.ledger_faults += 1
            first_line = (str(e).strip().splitlines() or [""])[0][:200]
            problem = f"{type(e).__name__}: {first_line}" if first_line else type(e).__name__
            log.error(
                "ledger unavailable (%s): every reply goes out untracked, and recovery did not run",
                problem,
            )
            return problem
        return None

    def _run_sweep(self, platforms: frozenset[str]) -> tuple[list[dict[str, Any]], Any]:
        """The sweep's items and its counters (None from a sweep that keeps none)."""
        own = self._sweep == self.ledger.sweep_recoverable
        if not own:
            return list(self._sweep(self._now(), deliverable_platforms=platforms)), None
        self.ledger.last_sweep = None
        # The courier records each claimed reply's send start before sending it, after
        # its waits: a claim that a killed gateway never sent spends nothing (ADR 0070).
        items = self.ledger.sweep_recoverable(
            self._now(), deliverable_platforms=platforms, records_send=True
        )
        return items, self.ledger.last_sweep

    async def close(self) -> None:
        """Stop scheduled retries (the boot sweep owns them now) and flush the writer."""
        if self._closed:
            return
        self._closed = True
        if self._sharing is not None:
            self._sharing.cancel()
            await asyncio.gather(self._sharing, return_exceptions=True)
            if self.budget is not None:
                try:
                    await self.writer.call(self.budget.leave, self.owner)
                except Exception as e:
                    self._courier.fault("-", "budget", e)
        await self.scheduler.close()
        await self.flush()
        await asyncio.get_running_loop().run_in_executor(None, self.writer.close)
        self._courier.close()
        self.ledger.close()

    async def flush(self) -> None:
        """Wait until every result written behind so far has landed or been counted as a
        fault; call it before reading this gateway's latest results from the ledger."""
        await self.writer.flush()
        await self._courier.settle_background()

    async def report_status(
        self,
        obligation_id: str,
        status: str,
        at: datetime | None = None,
        detail: str = "",
        message_id: str | None = None,
    ) -> bool:
        """A platform's status after it accepted a reply (``delivered_to_device``,
        ``read``, ``failed_after_acceptance``; ADR 0050): recorded in order, a late or
        repeated one changes nothing (False); a failure after acceptance reopens the
        obligation and schedules its re-send. Adapters with ``attach_status_sink`` get
        this method at ``start``, to call from their status webhooks."""
        return await self._courier.report_status(obligation_id, status, at, detail, message_id)

    async def __aenter__(self) -> Gateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> GatewayStats:
        c, w = self._courier.counters, self.writer.stats
        r = self._courier.reconciler.counters
        return GatewayStats(
            delivered=c.delivered,
            failed=c.failed,
            abandoned=c.abandoned,
            skipped=c.skipped,
            already_recorded=c.already_recorded,
            ledger_faults=c.ledger_faults,
            recovered=c.recovered,
            retries_scheduled=c.retries_scheduled,
            rate_limit_waits=c.rate_limit_waits,
            commits=w.commits,
            events=w.events,
            largest_group=w.largest_group,
            group_conflicts=w.conflicts,
            late_results=c.late_results,
            untracked=c.untracked,
            erased=c.erased,
            reconciled_arrived=r.arrived,
            reconciled_not_arrived=r.not_arrived,
            reconciled_unknown=r.unknown,
            reconcile_bad_answers=r.bad_answers,
            status_reports=c.status_reports,
            failed_after_acceptance=c.failed_after_acceptance,
            pacing=self._courier.pacer.stats(),
        )

    # -- the delivery path (flight.py) --------------------------------------------------------

    def skip_reason(self, context: ReplyContext, reply: Reply) -> str | None:
        """Why this reply skips the ledger (empty, ephemeral, a command's), or None."""
        return self._courier.skip_reason(context, reply)

    async def deliver(
        self, context: ReplyContext, reply: Reply, inbound_message_id: str | None = None
    ) -> DeliveryOutcome:
        """The only way a final reply leaves the gateway."""
        cause = causes.inbound(self.ledger, context.session_key, inbound_message_id)
        with (
            tracing.span("deliver", platform=context.platform) as opened,
            causes.caused_by(cause, correlation_id=causes.open_turn_or(cause)),
        ):
            outcome = await self._courier.deliver(context, reply, inbound_message_id)
            tracing.annotate(
                opened,
                obligation_id=outcome.obligation_id,
                status=outcome.status,
                error_class=outcome.error_class,
            )
        return outcome
