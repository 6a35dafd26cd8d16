"""Stored topics never change when code moves (domain/topics.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eventsourcing.utils import get_topic, resolve_topic

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.domain.sessions.route import InboundMessage, SessionKeying, SessionRoute
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.topics import (
    STORED_AGGREGATES,
    TOPIC_ALIASES,
    stored_classes,
    topics_of,
)
from tests.quarantine_support import NEWER_TOPIC

AGGREGATES = (DeliveryObligation, Session, SessionRoute, SessionKeying, InboundMessage, Erasure)


def stored_topic(cls: type) -> str:
    owner = next(a for a in STORED_AGGREGATES if cls in stored_classes(a))
    return f"{STORED_AGGREGATES[owner]}:{cls.__qualname__}"


GOLDEN = Path(__file__).parent / "golden"


def golden_topics() -> set[str]:
    topics: set[str] = set()
    for db in GOLDEN.glob("*/store.db"):
        with sqlite3.connect(db) as conn:
            topics |= {t for (t,) in conn.execute("SELECT DISTINCT topic FROM stored_events")}
    return topics


def test_every_class_is_written_and_resolved_under_its_stored_topic() -> None:
    assert set(AGGREGATES) == set(STORED_AGGREGATES)  # every aggregate declares it
    for aggregate in AGGREGATES:
        for cls in stored_classes(aggregate):
            topic = stored_topic(cls)
            assert get_topic(cls) == topic  # the library's write path uses the pin
            assert resolve_topic(topic) is cls  # and its read path finds the class


def test_every_topic_in_the_golden_stores_is_a_pinned_one() -> None:
    pinned = {stored_topic(c) for a in AGGREGATES for c in stored_classes(a)}
    pinned |= set(TOPIC_ALIASES)  # the former topics of renamed classes
    assert golden_topics() - {NEWER_TOPIC} <= pinned  # NEWER_TOPIC: planted, unknown on purpose


def test_a_renamed_class_resolves_its_former_topic_and_is_written_under_its_new_one() -> None:
    former = "gateway_ledger.domain.erasure:Erasure.SubjectErased"
    assert {former: Erasure.SubjectForgotten} == TOPIC_ALIASES
    assert resolve_topic(former) is Erasure.SubjectForgotten
    assert get_topic(Erasure.SubjectForgotten) == (
        "gateway_ledger.domain.erasure:Erasure.SubjectForgotten"
    )
    assert topics_of(Erasure.SubjectForgotten) == [get_topic(Erasure.SubjectForgotten), former]
    assert former in golden_topics()  # the 0.1.0 store holds events under the former name


def test_a_new_store_is_written_with_the_stored_topics(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "l.db", encrypt=False)
    try:
        ledger.record_obligation(
            obligation_id="o-1", session_key="s", platform="telegram", chat_id="1", content="x"
        )
        ledger.mark_attempting("o-1")
    finally:
        ledger.close()
    with sqlite3.connect(tmp_path / "l.db") as conn:
        topics = [t for (t,) in conn.execute("SELECT topic FROM stored_events")]
        state = conn.execute("SELECT state FROM stored_events LIMIT 1").fetchone()[0]
    assert topics == [
        "gateway_ledger.domain.obligation:DeliveryObligation.Recorded",
        "gateway_ledger.domain.obligation:DeliveryObligation.Attempting",
    ]
    assert b"gateway_ledger.domain.obligation:DeliveryObligation" in state
    assert DeliveryObligation.__module__ == "gateway_ledger.domain.delivery.obligation"
