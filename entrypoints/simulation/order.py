"""Order and pacing as users and the ledger saw them (``simulate``'s report, ADR 0065).

**Out of order**: each chat's journal is walked in arrival order (``seq``). A reply X
counts when the first copy of one of its parts arrives after any message of a reply Y
to the same chat recorded after X, unless Y's history has ``OrderReleased(behind=X)``
(order given up, on the record). Record order is the ``Recorded`` timestamp (every
gateway of a run is on one host, one clock), then the turn index. Counting every part,
not only a reply's first, also catches a later reply slipped between the parts of an
earlier one, which a user sees as interleaved replies.

Copies the platform took and then dropped (``failed_after_acceptance``) count where the
platform took them: the gateway handed them over in order, and learnt only afterwards
that the user never got them. Counted without them (as the user saw the chat), the
replies re-sent after the drop land behind later ones: reported apart
(``out_of_order_after_drop``), no gateway can prevent them.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE


@attrs.frozen
class Arrival:
    """One message a platform took, as the order count needs it."""

    seq: int
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    content: str
    media_uri: str | None
    dropped: bool = False
    """Taken, then dropped by the platform: the user never saw it."""


def part_key(msg: Any) -> tuple[str, str, str]:
    """(reply_to, kind, identity): which part of which reply a message is, as a user sees
    it (the duplicate marker stripped): text by its text, media by its URI."""
    if msg.media_uri is not None:
        return (msg.reply_to or "", "media", msg.media_uri)
    text = msg.content
    if text.startswith(DUPLICATE_NOTICE):
        text = text[len(DUPLICATE_NOTICE) :].removeprefix("\n")
    return (msg.reply_to or "", "text", text)


def read_arrivals(path: str | Path) -> list[Arrival]:
    """Every message of one platform's journal, dropped ones too, in arrival order."""
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(str(path), timeout=30)
    try:
        rows = conn.execute(
            "SELECT seq, chat_id, thread_id, reply_to, content, media_uri, failed"
            " FROM received ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    return [
        Arrival(seq, chat, thread, reply_to, content, media, bool(failed))
        for seq, chat, thread, reply_to, content, media, failed in rows
    ]


def out_of_order(
    arrivals: Iterable[Arrival],
    rank: Mapping[str, Any],
    released: Mapping[str, Iterable[str]],
    *,
    with_dropped: bool = True,
) -> list[str]:
    """The replies (by inbound id, ``reply_to``) that arrived after a later reply to the
    same chat without a recorded release. ``rank``: each reply's record order (compared
    within a chat; a reply missing from it is not judged); ``released``: for a reply Y,
    the earlier replies Y went before on the record (``OrderReleased``)."""
    seen: dict[tuple[str, str | None], set[str]] = defaultdict(set)
    first_copies: set[tuple[str, str, str]] = set()
    overtaken: list[str] = []
    counted: set[str] = set()
    for msg in sorted(arrivals, key=lambda m: m.seq):
        reply = msg.reply_to
        if reply is None or reply not in rank or (msg.dropped and not with_dropped):
            continue
        chat = (msg.chat_id, msg.thread_id)
        key = part_key(msg)
        if key not in first_copies:
            first_copies.add(key)
            if reply not in counted and any(
                rank[later] > rank[reply] and reply not in released.get(later, ())
                for later in seen[chat]
            ):
                counted.add(reply)
                overtaken.append(reply)
        seen[chat].add(reply)
    return overtaken


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(share * len(ordered))) - 1)]


@attrs.define
class OrderTally:
    """What the obligations' histories say about order and pacing, filled one obligation
    at a time, then set against the platforms' journals."""

    inbound_of: Mapping[str, str]
    """Obligation id -> inbound id (``reply_to`` on the platforms)."""
    rank: dict[str, tuple[float, int]] = attrs.field(factory=dict)
    released: dict[str, set[str]] = attrs.field(factory=lambda: defaultdict(set))
    order_released: int = 0
    released_by_reason: Counter[str] = attrs.field(factory=Counter)
    waited: list[float] = attrs.field(factory=list)
    waited_by_reason: dict[str, float] = attrs.field(factory=lambda: defaultdict(float))
    waits: int = 0

    def add(self, inbound_id: str, turn_index: int, history: Sequence[Any]) -> None:
        if history and history[0].type == "Recorded":
            self.rank[inbound_id] = (history[0].timestamp.timestamp(), turn_index)
        seconds = 0.0
        for entry in history:
            if entry.type == "Waited":
                self.waits += 1
                wait = float(entry.fields.get("seconds", 0.0))
                seconds += wait
                self.waited_by_reason[str(entry.fields.get("reason", "?"))] += wait
            elif entry.type == "OrderReleased":
                self.order_released += 1
                self.released_by_reason[str(entry.fields.get("reason", "?"))] += 1
                behind = self.inbound_of.get(str(entry.fields.get("behind", "")))
                if behind is not None:
                    self.released[inbound_id].add(behind)
        self.waited.append(seconds)

    def overtaken(self, arrivals: Sequence[Arrival], *, with_dropped: bool = True) -> list[str]:
        return out_of_order(arrivals, self.rank, self.released, with_dropped=with_dropped)
