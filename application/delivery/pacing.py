"""Per-chat order and one rate budget per platform and chat (ADR 0065, 0060).

Every send of a gateway, live, retried or recovered, passes through one :class:`Pacer`
on the event loop:

- **Order** (:meth:`Pacer.turn`): within one delivery target (platform, chat, thread) a
  reply goes after every earlier unresolved reply, in the order they were recorded. An
  earlier reply that is parked (left to a later boot sweep) does not hold the queue; one
  that stays unresolved past ``order_wait`` while the queue does not move stops holding
  it. Either way the later reply
  is told whom it goes before, and records ``OrderReleased`` before its send. Earlier
  replies owned by another gateway of the store (``foreign``: loaded from the store at
  start, re-checked there while one holds a queue) hold it like this gateway's own.
- **Rate** (:meth:`Pacer.hand_off`): the last step before ``adapter.send``, with no
  await after it: a hand-off waits until the platform's declared limits (``rate_limits``)
  allow it, per bot and per chat, and until any pause a ``retry_after`` set on its chat or
  bot is over. Limits are sliding windows ("at most N in any window of T seconds"); the
  instants recorded are the hand-offs themselves, so what the platform sees is what was
  counted. The bot's budget is shared out between the gateways that send through it
  (:meth:`Pacer.share`, kept by ``gateway.py`` from the store, ADR 0060).

Nothing here touches the store or a clock other than the injected monotonic ``clock``.
A platform that declares no limits and a chat with nothing ahead cost a few dictionary
lookups per reply.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

import attrs

from gateway_ledger.application.delivery.rate_limits import BOT, CHAT, Limit, RateLimits
from gateway_ledger.domain.delivery.ordering import OrderRelease, WaitReason
from gateway_ledger.domain.values import DeliveryTarget, OwnerIdentity

TargetKey = tuple[str, str, str | None]
"""(platform, chat id, thread id): one queue, and one chat's budget."""

MARGIN = 0.02
"""Windows are kept this much longer than declared: a platform that times the hand-off a
little differently from us (a clock read apart, its own rounding) still sees the limit."""
SLACK = 0.02
"""And this many seconds longer still: between the instant counted and the request
leaving, the loop's thread may wait for the GIL (a switch interval is 5 ms) or the OS."""


def kept_for(limit: Limit) -> float:
    """How long a hand-off counts in its window: the declared window, kept longer by
    ``MARGIN`` and ``SLACK``."""
    return limit.per * (1 + MARGIN) + SLACK


DEFAULT_POLL = 0.25
"""Seconds between two looks at the store while another gateway's reply holds a queue."""

ACTIVE = "active"
"""This gateway is sending it, or will (a retry is scheduled)."""
PARKED = "parked"
"""Unresolved, but left to a later boot sweep: it does not hold its queue."""
FOREIGN = "foreign"
"""Owned by another gateway of the store: holds the queue until the store says resolved."""
OVERTAKEN = "overtaken"
"""Held its queue past ``order_wait``: later replies go before it (each says so)."""

Recheck = Callable[[list[str]], Awaitable[Collection[str]]]
"""Which of these (foreign) obligation ids are still unresolved, asked of the store."""


class SharedBudget(Protocol):
    """Where the gateways of one store share their bots' budgets (ADR 0060)."""

    def renew(
        self, owner: OwnerIdentity, platforms: Sequence[str], ttl: float
    ) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """Keep this gateway's share; the gateways per platform and the bot pauses."""

    def pause(self, platform: str, seconds: float) -> None:
        """Tell the others a platform paused the whole bot."""

    def leave(self, owner: OwnerIdentity) -> None:
        """Give this gateway's shares back."""


def target_key(target: DeliveryTarget) -> TargetKey:
    return (target.platform, target.chat_id, target.thread_id)


@attrs.define(eq=False)
class Place:
    """One reply's place in its target's queue."""

    obligation_id: str
    key: TargetKey
    recorded_at: datetime
    state: str = ACTIVE

    @property
    def order(self) -> tuple[datetime, str]:
        return (self.recorded_at, self.obligation_id)


@attrs.frozen
class Turn:
    """What waiting for its turn came to: seconds waited and whom it goes before."""

    waited: float = 0.0
    released: tuple[tuple[str, OrderRelease], ...] = ()


NO_WAIT = Turn()


class Window:
    """The recent hand-offs of one scope, as many as its limit counts."""

    __slots__ = ("limit", "times")

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.times: deque[float] = deque(maxlen=limit.sends)

    def free_at(self, now: float) -> float:
        """The first instant a hand-off fits in the limit (``now`` if it fits now)."""
        if len(self.times) < self.limit.sends:
            return now
        return max(now, self.times[0] + kept_for(self.limit))

    def take(self, now: float) -> None:
        self.times.append(now)

    def idle(self, now: float) -> bool:
        return not self.times or self.times[-1] + kept_for(self.limit) <= now


@attrs.frozen
class Pause:
    """A pause in force: on the bot (``scope`` bot) or one chat, until ``seconds`` from now."""

    platform: str
    scope: str
    seconds: float


@attrs.frozen
class PacingStats:
    queued: dict[str, int]
    """Replies waiting for their turn or their hand-off, by platform."""
    oldest_wait: float
    """Seconds the longest-waiting of them has waited (0: none waits)."""
    pauses: tuple[Pause, ...]
    order_released: int
    waits: int


class Turnstile:
    """One sender at a time through a bot's window: a reply already under way (its next
    part) first, then first come, first served. A backlog then finishes replies one
    after another instead of sending every reply's first part before any second part,
    so each chat's queue moves as soon as it can."""

    def __init__(self) -> None:
        self.busy = False
        self.waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self.arrivals = 0

    async def acquire(self, priority: int) -> None:
        if not self.busy and not self.waiting:
            self.busy = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.arrivals += 1
        heapq.heappush(self.waiting, (priority, self.arrivals, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed the turn, then cancelled: pass it on
            raise

    def release(self) -> None:
        while self.waiting:
            _, _, future = heapq.heappop(self.waiting)
            if not future.done():
                future.set_result(None)  # the turn passes straight to it
                return
        self.busy = False


class Pacer:
    """One gateway's order and rate budget; used from its event loop only."""

    def __init__(
        self,
        *,
        order_wait: float,
        clock: Callable[[], float] = time.monotonic,
        poll: float = DEFAULT_POLL,
        recheck: Recheck | None = None,
    ) -> None:
        self.order_wait = order_wait
        self.clock = clock
        self.poll = poll
        self.recheck = recheck
        self.limits: dict[str, RateLimits] = {}
        self.shares: dict[str, int] = {}
        self.queues: dict[TargetKey, list[Place]] = {}
        self.places: dict[str, Place] = {}
        self.changed: dict[TargetKey, asyncio.Event] = {}
        self.bot_windows: dict[str, Window] = {}
        self.bot_queues: dict[str, Turnstile] = {}
        self.chat_windows: dict[TargetKey, Window] = {}
        self.bot_pauses: dict[str, float] = {}
        self.chat_pauses: dict[TargetKey, float] = {}
        self.waiting: dict[int, tuple[str, float]] = {}
        self.order_released = 0
        self.waits = 0
        self.began: float | None = None
        """When this gateway began sending (``begin``): another gateway may have sent to
        any chat just before, so each chat's first window counts as full from then."""

    # -- platforms and their budget -------------------------------------------------------

    def add_platform(self, platform: str, limits: RateLimits) -> None:
        self.limits[platform] = limits
        self.bot_windows.pop(platform, None)

    def share(self, platform: str, gateways: int) -> None:
        """``gateways`` send through this platform's bot (this one included): each keeps
        an equal part of the bot's limit (ADR 0060)."""
        gateways = max(1, gateways)
        if self.shares.get(platform, 1) != gateways:
            self.shares[platform] = gateways
            old = self.bot_windows.pop(platform, None)
            limit = self.bot_limit(platform)
            if old is not None and limit is not None:
                # The new share starts from the hand-offs already made, not from none.
                window = self.bot_windows[platform] = Window(limit)
                window.times.extend(old.times)

    def shared_platforms(self) -> list[str]:
        """The platforms whose bot limit is shared out between gateways."""
        return sorted(p for p, limits in self.limits.items() if limits.per_bot is not None)

    def bot_limit(self, platform: str) -> Limit | None:
        limits = self.limits.get(platform)
        if limits is None or limits.per_bot is None:
            return None
        whole = limits.per_bot
        return Limit(max(1, whole.sends // self.shares.get(platform, 1)), whole.per)

    def _bot_window(self, platform: str) -> Window | None:
        window = self.bot_windows.get(platform)
        if window is None:
            limit = self.bot_limit(platform)
            if limit is None:
                return None
            window = self.bot_windows[platform] = Window(limit)
        return window

    def begin(self) -> None:
        """This gateway starts sending: what others sent to a chat in the last window is
        unknown here (a gateway restarted in another's place, a sweeper's re-sends), so a
        chat's first hand-off waits out one window from now."""
        self.began = self.clock()

    def _chat_window(self, target: DeliveryTarget, key: TargetKey) -> Window | None:
        window = self.chat_windows.get(key)
        if window is None:
            limits = self.limits.get(target.platform)
            limit = None if limits is None else limits.chat_limit(target)
            if limit is None:
                return None
            window = self.chat_windows[key] = Window(limit)
            began = self.began
            if began is not None and self.clock() - began < kept_for(limit):
                window.times.extend([began] * limit.sends)
        return window

    def answered(self, target: DeliveryTarget) -> None:
        """A send to ``target`` came back (answered, or raised): the platform had it by
        now, so the chat's window counts that hand-off from now, not from when it left.
        Whatever held the request up between the count and the platform (the GIL,
        another process's turn on a busy CPU) then never brings two arrivals at one chat
        closer than its window; the next send to the chat waits at most one round trip
        more. (A chat's sends from one gateway go one after another, so the newest
        instant is this send's; where one is still out, moving it later only waits more.)"""
        window = self.chat_windows.get(target_key(target))
        if window is not None and window.times:
            now = self.clock()
            if window.times[-1] < now:
                window.times[-1] = now

    def pause(self, target: DeliveryTarget, scope: str, seconds: float) -> None:
        """The platform said ``retry_after``: nothing more goes to that scope (the chat,
        or the whole bot) from any sender of this gateway until it is over."""
        if scope == BOT:
            self.pause_bot(target.platform, seconds)
        else:
            key = target_key(target)
            until = self.clock() + max(0.0, seconds)
            self.chat_pauses[key] = max(until, self.chat_pauses.get(key, 0))

    def resume(self, target: DeliveryTarget) -> None:
        """The retry of the reply that was told ``retry_after`` is due (its scheduler
        waited it out): its chat and bot go again, starting with it."""
        self.chat_pauses.pop(target_key(target), None)
        self.bot_pauses.pop(target.platform, None)

    def pause_bot(self, platform: str, seconds: float) -> None:
        """Nothing goes to the platform's bot for ``seconds``: a 429 for the whole bot,
        this gateway's or one another gateway of the store was told of (ADR 0060)."""
        until = self.clock() + max(0.0, seconds)
        self.bot_pauses[platform] = max(until, self.bot_pauses.get(platform, 0))

    def _free_at(
        self, target: DeliveryTarget, key: TargetKey, now: float, *, bot: bool = True
    ) -> tuple[float, str]:
        """When a hand-off to ``target`` may go, and what holds it (a WaitReason value);
        ``bot=False``: its chat's window and the pauses only."""
        at, why = now, ""
        paused = max(self.bot_pauses.get(target.platform, 0), self.chat_pauses.get(key, 0))
        if paused > at:
            at, why = paused, WaitReason.PAUSE.value
        windows = (
            self._bot_window(target.platform) if bot else None,
            self._chat_window(target, key),
        )
        for window in windows:
            if window is not None:
                free = window.free_at(at)
                if free > at:
                    at, why = free, WaitReason.RATE.value
        return at, why

    def paces(self, target: DeliveryTarget) -> bool:
        """Whether anything can hold a hand-off to ``target`` now: its platform's declared
        limits, or a pause. When nothing can, a sender need not ask (``ready``,
        ``hand_off``): they would return at once, having counted nothing."""
        return target.platform in self.limits or bool(self.bot_pauses or self.chat_pauses)

    async def ready(self, target: DeliveryTarget) -> tuple[float, str]:
        """Wait until a hand-off to ``target`` would fit, without counting one: a sender
        that has writes to make or an owner to prove first waits here, then hands off."""
        return await self._wait_free(target, take=False)

    async def hand_off(
        self,
        target: DeliveryTarget,
        *,
        under_way: bool = False,
        before: Callable[[], Awaitable[object]] | None = None,
    ) -> tuple[float, str]:
        """Wait until a hand-off to ``target`` fits every limit and pause, then count it.

        Call it as the last step before ``adapter.send``: no await may come between the
        two, so the instant counted is the hand-off the platform sees. Returns the seconds
        waited and why (the last thing that held it: ``rate`` or ``pause``; "" if none).
        ``before``: awaited once, when the hand-off first fits and this sender holds the
        bot's turn, and before it is counted; the limits are checked again after it (a
        recovered reply records there that its send starts, ADR 0070).
        """
        return await self._wait_free(target, take=True, under_way=under_way, before=before)

    async def _wait_free(
        self,
        target: DeliveryTarget,
        *,
        take: bool,
        under_way: bool = False,
        before: Callable[[], Awaitable[object]] | None = None,
    ) -> tuple[float, str]:
        """Sleep until the chat's window and the pauses let a hand-off go; to take one,
        then queue for the bot's window (:class:`Turnstile`: a reply under way first,
        then first come, first served, so a bot's budget never starves a reply)."""
        if not self.paces(target):
            return 0.0, ""
        platform = target.platform
        key = target_key(target)
        started = now = self.clock()
        reason = ""
        token = id(object())
        slept = False
        try:
            while True:
                at, why = self._free_at(target, key, now, bot=not take)
                if at > now:
                    reason = why
                    self.waiting.setdefault(token, (platform, started))
                    await asyncio.sleep(at - now)
                    now, slept = self.clock(), True
                    continue
                if not take:
                    break
                turnstile = self._bot_queue(platform)
                await turnstile.acquire(0 if under_way else 1)
                try:
                    while True:
                        now = self.clock()
                        at, why = self._free_at(target, key, now)
                        if at <= now and before is not None:
                            await before()  # holding the turn: nobody takes the windows
                            before = None
                            continue  # it took time: a pause may have come in
                        if at <= now or why != WaitReason.RATE.value:
                            break
                        reason = why
                        self.waiting.setdefault(token, (platform, started))
                        await asyncio.sleep(at - now)
                        slept = True
                    if at <= now:
                        for window in (self._bot_window(platform), self._chat_window(target, key)):
                            if window is not None:
                                window.take(now)
                        break
                finally:
                    turnstile.release()
                # a pause came in while queued: wait it out of the queue, then queue again
        finally:
            self.waiting.pop(token, None)
        waited = now - started if slept else 0.0
        if waited > 0:
            self.waits += 1
        self._forget_idle(now)
        return waited, reason

    def _bot_queue(self, platform: str) -> Turnstile:
        turnstile = self.bot_queues.get(platform)
        if turnstile is None:
            turnstile = self.bot_queues[platform] = Turnstile()
        return turnstile

    def _forget_idle(self, now: float) -> None:
        """Drop chat windows and pauses that no longer hold anything back."""
        if len(self.chat_windows) > 1024:
            for key in [k for k, w in self.chat_windows.items() if w.idle(now)]:
                del self.chat_windows[key]
        if self.chat_pauses and len(self.chat_pauses) > 64:
            for key in [k for k, until in self.chat_pauses.items() if until <= now]:
                del self.chat_pauses[key]
        for platform in [p for p, until in self.bot_pauses.items() if until <= now]:
            del self.bot_pauses[platform]

    # -- order ------------------------------------------------------------------------------

    def enter(
        self, obligation_id: str, target: DeliveryTarget, recorded_at: datetime, state: str = ACTIVE
    ) -> Place:
        """Take a place in the target's queue, by when the reply was recorded."""
        place = Place(obligation_id, target_key(target), recorded_at, state)
        queue = self.queues.setdefault(place.key, [])
        for other in queue:
            if other.obligation_id == obligation_id:
                other.state = state if other.state == FOREIGN else other.state
                return other
        if not queue or queue[-1].order <= place.order:
            queue.append(place)
        else:
            bisect.insort(queue, place, key=lambda p: p.order)
        self.places[obligation_id] = place
        return place

    def leave(self, place: Place) -> None:
        """Resolved, or no longer this gateway's to send: it holds nothing any more."""
        queue = self.queues.get(place.key)
        if queue is None:
            return
        try:
            queue.remove(place)
        except ValueError:
            return
        if self.places.get(place.obligation_id) is place:
            del self.places[place.obligation_id]
        if not queue:
            del self.queues[place.key]
        self._wake(place.key)

    def park(self, place: Place) -> None:
        """Left to a later boot sweep: later replies go before it (and say so)."""
        if place.state != PARKED:
            place.state = PARKED
            self._wake(place.key)

    def park_id(self, obligation_id: str) -> None:
        """Its sender stopped (cancelled) with it unresolved: a boot sweep owns it now."""
        place = self.places.get(obligation_id)
        if place is not None and place.state == ACTIVE:
            self.park(place)

    def hand_over(self, place: Place) -> None:
        """Another gateway took it (a claim): it holds the queue until the store says it
        is resolved."""
        if place.state != FOREIGN:
            place.state = FOREIGN
            self._wake(place.key)

    def claimed(self, place: Place) -> None:
        """This gateway claimed the reply from an owner that died or lost its lease: the
        owner may have handed it (or another reply) to the chat just before, however long
        ago this gateway began, so the chat's window counts as full from the claim."""
        self._handed_over(place.key)

    def _wake(self, key: TargetKey) -> None:
        event = self.changed.pop(key, None)
        if event is not None:
            event.set()

    def ahead(self, place: Place) -> list[Place]:
        queue = self.queues.get(place.key, ())
        return [p for p in queue if p is not place and p.order < place.order]

    def holds(self, place: Place) -> bool:
        """Whether a reply earlier in its queue holds this one: ``turn`` would wait."""
        return len(self.queues.get(place.key, ())) > 1 and bool(self.ahead(place))

    def would_wait(self, place: Place, target: DeliveryTarget) -> bool:
        """Would this reply wait (its turn, or its hand-off) if it went now?"""
        if self.holds(place):
            return True
        if not self.paces(target):
            return False
        now = self.clock()
        return self._free_at(target, place.key, now)[0] > now

    async def turn(self, place: Place) -> Turn:
        """Wait until nothing earlier holds this reply's queue: at most ``order_wait`` for
        any one reply ahead that stays unresolved (the bound counts again each time the
        queue moves), so a long queue that drains is waited out, a stuck reply is not.

        At the bound only the oldest reply still holding is given up, and the bound counts
        again for the next: a reply behind it may be another live gateway's, about to go,
        and given up at once with the stuck one, two gateways would send to the chat side
        by side, each within its own window and together over the chat's limit."""
        if not self.holds(place):
            return NO_WAIT
        started = self.clock()
        deadline = started + self.order_wait
        token = id(place)
        held_by = len(self.queues.get(place.key, ()))
        try:
            while True:
                ahead = self.ahead(place)
                holding = [p for p in ahead if p.state in (ACTIVE, FOREIGN)]
                now = self.clock()
                if len(holding) < held_by:
                    # One ahead was settled: the queue moves. The bound is on a reply that
                    # stays stuck, so it counts again from here for the next one.
                    held_by, deadline = len(holding), now + self.order_wait
                if not holding:
                    break
                if now >= deadline:
                    holding[0].state = OVERTAKEN  # later replies no longer wait for it either
                    self._wake(place.key)
                    continue  # the queue moved: the bound counts again for the next
                self.waiting.setdefault(token, (place.key[0], started))
                foreign = [p for p in holding if p.state == FOREIGN]
                timeout = deadline - now
                if foreign and self.recheck is not None:
                    timeout = min(timeout, self.poll)
                event = self.changed.setdefault(place.key, asyncio.Event())
                try:
                    await asyncio.wait_for(event.wait(), timeout=timeout)
                except TimeoutError:
                    if foreign and self.recheck is not None:
                        await self._recheck(foreign)
        finally:
            self.waiting.pop(token, None)
        waited = self.clock() - started
        released = tuple(
            (p.obligation_id, OrderRelease.PARKED if p.state == PARKED else OrderRelease.TIMEOUT)
            for p in self.ahead(place)
        )
        self.order_released += len(released)
        if waited > 0:
            self.waits += 1
        return Turn(waited, released)

    async def _recheck(self, foreign: list[Place]) -> None:
        assert self.recheck is not None
        try:
            unresolved = set(await self.recheck([p.obligation_id for p in foreign]))
        except Exception:
            return  # the store is unreachable: the bound still ends the wait
        for place in foreign:
            if place.obligation_id not in unresolved:
                self.leave(place)
                self._handed_over(place.key)

    def _handed_over(self, key: TargetKey) -> None:
        """Another gateway sent to this chat up to now, how much is unknown here: its
        window counts as full from now, so the next hand-off keeps the chat's limit
        whatever the other sent."""
        limits = self.limits.get(key[0])
        if limits is None:
            return
        target = DeliveryTarget(platform=key[0], chat_id=key[1], thread_id=key[2])
        limit = limits.chat_limit(target)
        if limit is None:
            return
        window = self.chat_windows.get(key)
        if window is None:
            window = self.chat_windows[key] = Window(limit)
        window.times.extend([self.clock()] * limit.sends)

    def load_foreign(self, replies: Iterable[tuple[str, DeliveryTarget, datetime]]) -> int:
        """Earlier replies other gateways of the store owe (ADR 0065): they hold their
        queues until the store says they are resolved. Returns how many were new."""
        added = 0
        for obligation_id, target, recorded_at in replies:
            if obligation_id in self.places:
                continue
            self.enter(obligation_id, target, recorded_at, FOREIGN)
            added += 1
        return added

    # -- figures ------------------------------------------------------------------------------

    def stats(self) -> PacingStats:
        now = self.clock()
        queued: dict[str, int] = {}
        oldest = 0.0
        for platform, since in self.waiting.values():
            queued[platform] = queued.get(platform, 0) + 1
            oldest = max(oldest, now - since)
        pauses = [Pause(p, BOT, until - now) for p, until in self.bot_pauses.items() if until > now]
        pauses += [
            Pause(key[0], CHAT, until - now)
            for key, until in self.chat_pauses.items()
            if until > now
        ]
        return PacingStats(
            queued=queued,
            oldest_wait=round(oldest, 3) if math.isfinite(oldest) else 0.0,
            pauses=tuple(pauses),
            order_released=self.order_released,
            waits=self.waits,
        )
