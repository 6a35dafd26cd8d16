"""A conversation and a finished delivery that gateway tests share."""

from __future__ import annotations

from gateway_ledger.application.delivery.ports import Reply, ReplyContext
from gateway_ledger.bootstrap import Gateway
from tests.gateway_fakes import ScriptedAdapter

KEY = "agent:main:telegram:dm:7"
CTX = ReplyContext(session_key=KEY, platform="telegram", chat_id="7")


async def deliver_one(location: str, text: str = "first", inbound: str = "in-0") -> None:
    """One reply delivered to the end by a gateway of its own, then closed: what an
    earlier gateway (or an earlier run of the same turn) left in the store."""
    async with Gateway.open(location) as gw:
        await gw.start([ScriptedAdapter()])
        out = await gw.deliver(CTX, Reply(text), inbound)
        assert out.status == "delivered" and not out.ledger_fault
