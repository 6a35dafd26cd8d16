"""What a simulation run asks of the gateway: conversations, platforms, replies. Pure data.

Every reply part carries a unique tag, so the platforms' journals can be matched back to
obligations and parts exactly as a user would see them (marker prefix stripped).
"""

from __future__ import annotations

import random
from typing import Any

import attrs

from gateway_ledger.entrypoints.simulation.limits import sim_limits
from gateway_ledger.entrypoints.simulation.platform import PlatformBehaviour

CHUNK = 48
"""Replies longer than this are sent in chunks: multi-part obligations."""


@attrs.frozen
class Turn:
    conversation: int
    index: int
    session_key: str
    platform: str
    chat_id: str
    inbound_id: str
    content: str
    parts: tuple[str, ...]
    media: tuple[str, ...]  # media URIs, sent after the text
    think: float  # seconds the "agent" thinks before replying

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        d = dict(d)
        d["parts"] = tuple(d["parts"])
        d["media"] = tuple(d["media"])
        return cls(**d)

    @property
    def expected_parts(self) -> list[tuple[str, str]]:
        """(kind, identity) of every part, in send order: text by its text, media by URI."""
        texts = list(self.parts) if self.parts else [self.content]
        return [("text", t) for t in texts] + [("media", m) for m in self.media]


TELEGRAM_BAN = (3, 1.0, 1.5)
"""Three violations within a second ban the bot for 1.5 s (Telegram's flood control,
which answers a flood with a long ban; scaled to the simulation's time)."""


def default_platforms(dead: list[str]) -> dict[str, PlatformBehaviour]:
    return {
        "telegram": PlatformBehaviour(
            latency=(0.002, 0.02),
            rejected=0.02,
            rate_limited=0.03,
            ambiguous_before=0.02,
            ambiguous_after=0.02,
            rate_limited_bot=0.3,
            dead_chats=frozenset(c for c in dead if c.startswith("telegram")),
            # cannot reconcile: no nonce, and bots cannot read a chat's history
            limits=sim_limits("telegram"),
            ban=TELEGRAM_BAN,
        ),
        "slack": PlatformBehaviour(
            latency=(0.005, 0.03),
            rate_limited=0.08,
            retry_after=(0.05, 0.4),
            ambiguous_after=0.02,
            dead_chats=frozenset(c for c in dead if c.startswith("slack")),
            reconcile="history",  # conversations.history with client_msg_id: paged, 429s
            limits=sim_limits("slack"),
        ),
        "whatsapp": PlatformBehaviour(
            latency=(0.01, 0.05),
            rejected=0.03,
            ambiguous_before=0.03,
            ambiguous_after=0.03,
            dead_chats=frozenset(c for c in dead if c.startswith("whatsapp")),
            reconcile="callbacks",  # statuses sent/delivered/read/failed by webhook
            failed_after_acceptance=0.03,
            device_statuses=0.3,
            limits=sim_limits("whatsapp"),
        ),
        "discord": PlatformBehaviour(  # honours idempotency keys (nonce + enforce_nonce)
            latency=(0.002, 0.02),
            rate_limited=0.03,
            ambiguous_after=0.05,
            idempotent=True,
            dead_chats=frozenset(c for c in dead if c.startswith("discord")),
            reconcile="nonce",  # the nonce echoed back on the message
            rate_limited_bot=0.5,  # Discord's global rate limit
            limits=sim_limits("discord"),
        ),
    }


_WORDS = (
    "the", "reply", "owed", "to", "a", "user", "arrives", "once",
    "or", "says", "it", "may", "be", "a", "duplicate",
)  # fmt: skip


def build_turns(seed: int, conversations: int, turns: int) -> tuple[list[Turn], list[str]]:
    rng = random.Random(seed)
    platforms = ["telegram", "slack", "whatsapp", "discord"]
    out: list[Turn] = []
    dead: list[str] = []
    for c in range(conversations):
        platform = platforms[c % len(platforms)]
        chat = f"{platform}-chat-{c}"
        if rng.random() < 0.03:
            dead.append(chat)
        key = f"agent:main:{platform}:dm:{chat}"
        for t in range(turns):
            tag = f"[c{c} t{t}]"
            body = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 25)))
            content = f"{tag} {body}"
            parts: tuple[str, ...] = ()
            if len(content) > CHUNK:
                chunks = [content[i : i + CHUNK] for i in range(0, len(content), CHUNK)]
                # each chunk must be recognisable alone: tag it, keep the split exact
                parts = tuple(chunks)
            media = (f"file:///sim/{c}/{t}.png",) if rng.random() < 0.15 else ()
            out.append(
                Turn(
                    conversation=c,
                    index=t,
                    session_key=key,
                    platform=platform,
                    chat_id=chat,
                    inbound_id=f"in-{c}-{t}",
                    content=content,
                    parts=parts,
                    media=media,
                    think=rng.uniform(0.02, 0.15),
                )
            )
    return out, dead


def backlog_conversations(conversations: int, turns: int, backlog: int) -> int:
    """Enough conversations for a backlog of ``backlog`` replies that leaves each
    conversation at least one live turn after the restart."""
    if backlog <= 0:
        return conversations
    if turns < 2:
        raise ValueError("a backlog needs at least 2 turns per conversation")
    return max(conversations, -(-backlog // (turns - 1)))


def backlog_depths(conversations: int, turns: int, backlog: int) -> list[int]:
    """How many first turns of each conversation are in the backlog: ``backlog`` in all,
    spread evenly, never a conversation's last turn."""
    if backlog <= 0:
        return [0] * conversations
    base, extra = divmod(backlog, conversations)
    depths = [base + (c < extra) for c in range(conversations)]
    if max(depths) > turns - 1:
        raise ValueError(f"a backlog of {backlog} needs more than {conversations} conversations")
    return depths
