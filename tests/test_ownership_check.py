"""Before each hand-off, a lease holder that cannot prove its lease re-checks (ADR 0032).

In one process, on the real PostgreSQL server: "a pause" is the heartbeat's monotonic
clock jumping past the lease's local deadline, as SIGSTOP makes it; "a store that cannot
answer" is the events table held under an ACCESS EXCLUSIVE lock by another connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway_fakes import ScriptedAdapter
from psycopg import sql

from gateway_ledger.application.delivery.ports import (
    DUPLICATE_NOTICE,
    Reply,
    ReplyContext,
    SendResult,
)
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.values import DeliveryTarget, MediaItem, OwnerIdentity
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

CONTEXT = ReplyContext(session_key="agent:main:telegram:dm:9", platform="telegram", chat_id="9")
REPLY = Reply("first, second", parts=("first, ", "second"))
EARLIER = OwnerIdentity(
    host="gw-before-restart", boot_id="b-1", pid=4343, start_time=9, installation_id="inst-1"
)


class BetweenParts(ScriptedAdapter):
    """Runs ``between`` while the first part is with the platform."""

    def __init__(self, between: Callable[[], None]) -> None:
        super().__init__()
        self.between = between

    async def send(
        self,
        target: DeliveryTarget,
        content: str,
        *,
        reply_to: str | None,
        media: Sequence[MediaItem],
        metadata: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> SendResult:
        if not self.sent:
            self.between()
        return await super().send(
            target,
            content,
            reply_to=reply_to,
            media=media,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )


def paused(gw: Gateway) -> None:
    heartbeat = gw.ledger.heartbeat
    assert heartbeat is not None
    heartbeat.monotonic = lambda: time.monotonic() + 3600.0  # an hour stopped


def test_an_owner_that_cannot_prove_its_lease_nor_reach_the_store_marks_the_next_part(
    pg_url: str,
) -> None:
    asyncio.run(cannot_prove(pg_url))


async def cannot_prove(pg_url: str) -> None:
    gw = Gateway.open(pg_url, ledger_deadline=0.3)
    lock = connect(parse_postgres_url(pg_url))
    lock.autocommit = False
    schema = parse_postgres_url(pg_url)["schema"]
    release = threading.Timer(2.0, lock.commit)

    def pause_and_lock() -> None:
        paused(gw)
        lock.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema, "gateway_ledger_events")
            )
        )
        release.start()

    adapter = BetweenParts(pause_and_lock)
    await gw.start([adapter])
    try:
        outcome = await gw.deliver(CONTEXT, REPLY, "in-9")
    finally:
        release.join()
        lock.close()
    texts = [s.content for s in adapter.sent]
    assert texts[0] == "first, "
    assert len(texts) == 2 and texts[1].startswith(DUPLICATE_NOTICE) and "second" in texts[1]
    assert outcome.status == "delivered"
    assert gw.stats().ledger_faults >= 2  # the part's write, then the ownership check
    await gw.close()


def test_an_owner_that_proves_itself_after_a_pause_sends_plain_and_holds_again(
    pg_url: str,
) -> None:
    asyncio.run(proves_itself(pg_url))


async def proves_itself(pg_url: str) -> None:
    gw = Gateway.open(pg_url)
    adapter = BetweenParts(lambda: paused(gw))
    await gw.start([adapter])
    outcome = await gw.deliver(CONTEXT, REPLY, "in-9")
    assert [s.content for s in adapter.sent] == ["first, ", "second"]  # no false marker
    assert outcome.status == "delivered" and gw.stats().ledger_faults == 0
    heartbeat = gw.ledger.heartbeat
    assert heartbeat is not None and heartbeat.lapses == 2  # renewed by the check, late
    await gw.close()


def test_a_turn_recorded_before_is_not_sent_again_when_the_record_times_out(
    pg_url: str,
) -> None:
    """A restarted gateway re-runs a turn whose reply an earlier one recorded (and may
    have sent). Its record conflicts, so it is not sent again; but when the store is slow
    the record times out first, and the reply went out plain all the same (seen in
    ``simulate --faults`` under load). Now the id is re-checked before the hand-off."""
    earlier = DeliveryLedger.open(pg_url, owner=EARLIER)
    oid = compute_obligation_id(CONTEXT.session_key, "in-9", REPLY.content)
    earlier.record_obligation(
        obligation_id=oid,
        session_key=CONTEXT.session_key,
        platform="telegram",
        chat_id="9",
        content=REPLY.content,
        reply_to="in-9",
        parts=REPLY.parts,
    )
    earlier.mark_attempting(oid)
    asyncio.run(redeliver(pg_url, oid))
    assert [h.type for h in earlier.history(oid)] == ["Recorded", "Attempting"]
    earlier.close()


async def redeliver(pg_url: str, oid: str) -> None:
    gw = Gateway.open(pg_url, ledger_deadline=0.3)
    adapter = ScriptedAdapter()
    await gw.start([adapter])
    lock = connect(parse_postgres_url(pg_url))
    lock.autocommit = False
    lock.execute(  # writes wait (past the deadline); reads go on
        sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
            sql.Identifier(parse_postgres_url(pg_url)["schema"], "gateway_ledger_events")
        )
    )
    release = threading.Timer(1.5, lock.commit)
    release.start()
    try:
        outcome = await gw.deliver(CONTEXT, REPLY, "in-9")
    finally:
        release.join()
        lock.close()
    assert adapter.sent == []
    assert (outcome.status, outcome.obligation_id) == ("already_recorded", oid)
    await gw.close()
