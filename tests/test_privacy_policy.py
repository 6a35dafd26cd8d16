"""Every personal field is sealed at rest, as the declared policies say, for every event type.

The test knows no secret by heart. It takes the event types from the aggregates
themselves, requires each to be declared in its application's policy (sealed fields, or
clear ones, field by field), writes every one of them through the public API with
recognizable values, reads them back decrypted, collects the values of every field the
policies seal, and byte-scans the store (SQLite's db, -wal and -shm; every row of every
PostgreSQL table) for them. A new event type, or a new field, that nobody declared fails
here; so does a declared field that is stored in clear.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from eventsourcing.domain import Aggregate, DomainEvent
from eventsourcing.utils import get_topic, resolve_topic
from privacy_support import store_bytes

import gateway_ledger.domain
from gateway_ledger.application.delivery.dead_letters import retry_dead_letter
from gateway_ledger.application.delivery.importing import ImportedRow, import_rows
from gateway_ledger.application.privacy.erasure import DELIVERY_PRIVACY, SESSION_PRIVACY
from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.domain.sessions.route import (
    InboundMessage,
    SessionKeying,
    SessionRoute,
    route_uuid,
)
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import MediaItem, OwnerIdentity, QuarantineReason
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED, PrivacyPolicy

AGGREGATES: dict[str, tuple[type[Aggregate], ...]] = {
    "ledger": (DeliveryObligation, Erasure),
    "sessions": (Session, SessionRoute, InboundMessage, SessionKeying),
}
POLICIES: dict[str, PrivacyPolicy] = {"ledger": DELIVERY_PRIVACY, "sessions": SESSION_PRIVACY}
RECOGNIZABLE = 8
"""Values at least this long are scanned for (shorter ones could occur by chance)."""
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.setenv("GATEWAY_LEDGER_SECRET_DIR", str(tmp_path / "secret"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


def event_classes(aggregate: type[Aggregate]) -> list[type]:
    """The event types an aggregate stores: its event classes that no other one extends,
    but for the library's default ``Created`` where an ``@event`` ``__init__`` replaces it."""
    found = [
        v for v in vars(aggregate).values() if isinstance(v, type) and issubclass(v, DomainEvent)
    ]
    leaves = [c for c in found if not any(o is not c and issubclass(o, c) for o in found)]
    default = vars(aggregate).get("Created")
    if any(c is not default and issubclass(c, Aggregate.Created) for c in leaves):
        leaves = [c for c in leaves if c is not default]
    return leaves


def test_every_aggregate_of_the_domain_is_under_a_policy() -> None:
    """So a new aggregate cannot escape the test below by not being listed in it."""
    listed = {a for group in AGGREGATES.values() for a in group}
    for info in pkgutil.iter_modules(gateway_ledger.domain.__path__):
        module = importlib.import_module(f"gateway_ledger.domain.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Aggregate) and cls is not Aggregate:
                assert cls in listed, f"{cls.__qualname__} is in no application's policy test"


def test_every_event_type_is_declared_in_its_policy() -> None:
    for app, aggregates in AGGREGATES.items():
        for aggregate in aggregates:
            for cls in event_classes(aggregate):
                assert POLICIES[app].declares(cls), f"{cls.__qualname__}: not in the {app} policy"


def write_every_event_type(ledger: DeliveryLedger, store: SessionStore) -> None:
    """Every event type of both applications, with a recognizable value in every field."""
    source = SessionSource(
        platform="telegram",
        chat_id="chat-id-PII-4711",
        chat_name="chat-name-PII-4711",
        chat_type="group",
        user_id="user-id-PII-4711",
        user_name="user-name-PII-4711",
        thread_id="thread-id-PII-4711",
        chat_topic="chat-topic-PII-4711",
        user_id_alt="user-id-alt-PII-4711",
        chat_id_alt="chat-id-alt-PII-4711",
        scope_id="scope-id-PII-4711",
        parent_chat_id="parent-chat-PII-4711",
        message_id="message-id-PII-4711",
    )
    ctx = store.resolve(source, T0)  # Keying.Established, Route.Opened, Session.Started
    for i in range(21):  # MessageAppended, InboundMessage.Seen; a snapshot at 20
        store.append(ctx, "user", f"message-text-PII-{i:04}", f"platform-msg-PII-{i:04}", T0)
    store.mark_resume_pending(ctx.session_id, "resume-reason", T0)
    store.clear_resume_pending(ctx.session_id, T0)
    store.suspend(ctx.session_id, T0)
    store.reset(ctx.key, now=T0 + timedelta(seconds=1))  # Reset, Route.Rotated
    store.switch_session(ctx.key, ctx.session_id, now=T0 + timedelta(seconds=2))  # Reopened
    store.take_snapshot(route_uuid(ctx.key))

    key = ctx.key
    oid = ledger.record_obligation(
        obligation_id="o-all",
        session_key=key,
        platform="telegram",
        chat_id="target-chat-PII-4711",
        thread_id="target-thread-PII-4711",
        reply_to="reply-to-PII-4711",
        content="reply-content-PII-part-one|reply-content-PII-part-two",
        parts=["reply-content-PII-part-one|", "reply-content-PII-part-two"],
        media=[MediaItem(kind="photo", uri="file:///media-uri-PII-4711", caption="caption-PII")],
        metadata={"note": "metadata-value-PII-4711"},
    )
    ledger.mark_attempting(oid, guard="none")
    obligation: Any = ledger.repository.get(ledger.exists and DeliveryObligation.create_id(oid))
    obligation.acknowledge_part(
        by=ledger.owner, now=ledger.clock(), index=0, receipt=["part-receipt-PII-4711"]
    )
    ledger.save(obligation)  # PartDelivered
    ledger.mark_failed(oid, "failure-text-PII-4711", "ambiguous")
    obligation = ledger.repository.get(DeliveryObligation.create_id(oid))
    obligation.reconcile(  # Reconciled: part 1 arrived, the media part is still owed
        by=ledger.owner,
        now=ledger.clock(),
        outcome="arrived",
        evidence="evidence-PII-4711",
        message_ids=["reconciled-id-PII-4711"],
        part=1,
    )
    ledger.save(obligation)
    claimer = OwnerIdentity(host="other-host", boot_id="b", pid=4242, start_time=1)
    obligation = ledger.repository.get(DeliveryObligation.create_id(oid))
    obligation.claim(by=claimer, now=ledger.clock(), policy=ledger.policy, records_send=True)
    ledger.save(obligation)  # Claimed: the first owner is fenced out
    obligation = ledger.repository.get(DeliveryObligation.create_id(oid))
    obligation.start_recovery_send(by=claimer, now=ledger.clock())
    ledger.save(obligation)  # RecoverySendStarted
    ledger.mark_delivered(oid, ["late-receipt-PII-4711"], fence=0)  # LateResultReported
    ledger.mark_failed(oid, "late-failure-PII-4711", "ambiguous", fence=0)
    ledger.retry(oid, "operator-label")  # RetryRequested
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid, ["final-receipt-PII-4711"])
    ledger.report_status(  # StatusReported, reopening it
        oid, "failed_after_acceptance", None, "status-detail-PII-4711", "final-receipt-PII-4711"
    )
    ledger.record_obligation(
        obligation_id="o-dropped", session_key=key, platform="telegram", chat_id="c", content="x"
    )
    ledger.abandon("o-dropped", "operator", "abandon-detail-PII-4711")
    retry_dead_letter(ledger, "o-dropped", "ops")  # DeadLetterRetried
    ledger.record_obligation(
        obligation_id="o-paced", session_key=key, platform="telegram", chat_id="c", content="z"
    )
    obligation = ledger.repository.get(DeliveryObligation.create_id("o-paced"))
    obligation.note_wait(by=ledger.owner, now=ledger.clock(), reason="rate", seconds=0.5)
    obligation.release_order(  # OrderReleased: it went before o-dropped, owed again
        by=ledger.owner, now=ledger.clock(), behind="o-dropped", reason="timeout", waited=120.0
    )
    ledger.save(obligation)  # Waited, OrderReleased
    ledger.record_obligation(
        obligation_id="o-rotten", session_key=key, platform="telegram", chat_id="c", content="y"
    )
    obligation = ledger.repository.get(DeliveryObligation.create_id("o-rotten"))
    obligation.quarantine(
        reason=QuarantineReason.UNREADABLE, found_at=1, by=ledger.owner, now=ledger.clock()
    )
    ledger.save(obligation)  # Quarantined
    ledger.record_obligation(
        obligation_id="o-gone", session_key="agent:main:x:dm:gone", platform="x", chat_id="g",
        content="erased before the scan",
    )  # fmt: skip
    ledger.forget_session("agent:main:x:dm:gone")  # SubjectForgotten
    row = ImportedRow(
        obligation_id="0" * 24, session_key=key, platform="telegram",
        chat_id="imported-chat-PII-4711", thread_id="imported-thread-PII-4711",
        content="imported-content-PII-4711", state="failed", attempts=1, created_at=1.0e9,
        updated_at=1.0e9 + 1, owner_pid=1, owner_started_at=1,
        last_error="imported-error-PII-4711",
    )  # fmt: skip
    import_rows(ledger, [row], host="h", boot_id="b", source="hermes", now=T0)  # Imported


def flatten(value: Any) -> Iterator[str]:
    """The text in a value; ``[erased]`` (what an erased field reads as) is no secret."""
    if isinstance(value, str):
        if value != ERASED:
            yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from flatten(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(k)
            yield from flatten(v)
    elif attrs.has(type(value)):
        for f in attrs.fields(type(value)):
            yield from flatten(getattr(value, f.name))


def field_value(holder: Any, path: str) -> Any:
    head, _, attr = path.partition(".")
    value = holder.get(head) if isinstance(holder, dict) else getattr(holder, head, None)
    return getattr(value, attr, None) if attr and value is not None else value


def policy_of(event_class: type) -> PrivacyPolicy:
    declaring = [p for p in POLICIES.values() if p.declares(event_class)]
    assert len(declaring) == 1, f"{event_class.__qualname__}: declared in {len(declaring)} policies"
    return declaring[0]


def sealed_values(apps: dict[str, Any]) -> tuple[dict[str, set[str]], set[str]]:
    """Per sealed field (``Event.field``), the recognizable values stored in it (read back
    decrypted), and the topics stored; checks every stored event is fully classified."""
    values: dict[str, set[str]] = {}
    topics: set[str] = set()
    seen: set[tuple[Any, int]] = set()
    for reader in apps.values():
        for notification in reader.recorder.select_notifications(None, 100_000):
            position = (notification.originator_id, notification.originator_version)
            if position in seen:
                continue  # both applications share one table on some stores
            seen.add(position)
            policy = policy_of(resolve_topic(notification.topic))
            app = apps[next(name for name, p in POLICIES.items() if p is policy)]
            event = app.mapper.to_domain_event(notification)
            topics.add(notification.topic)
            assert policy.unclassified(event) == [], f"{notification.topic}: fields undeclared"
            spec = policy.by_topic.get(notification.topic)
            for path in spec.fields if spec is not None else ():
                name = f"{type(event).__qualname__}.{path}"
                found = {v for v in flatten(field_value(event, path)) if len(v) >= RECOGNIZABLE}
                values.setdefault(name, set()).update(found)
            if notification.originator_version == 1 and app.snapshots is not None:
                for stored in app.snapshots.recorder.select_events(notification.originator_id):
                    shot = app.mapper.to_domain_event(stored)
                    seal = policy.snapshot_by_topic.get(shot.topic)
                    assert seal is not None, f"snapshot of {shot.topic} not in the policy"
                    for path in seal.fields:
                        name = f"snapshot {shot.topic}.{path}"
                        found = {
                            v
                            for v in flatten(field_value(shot.state, path))
                            if len(v) >= RECOGNIZABLE
                        }
                        values.setdefault(name, set()).update(found)
    return values, topics


def test_no_field_the_policies_seal_is_in_clear_at_rest(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    store = SessionStore.open(store_location, raw_keys=True)
    write_every_event_type(ledger, store)

    secrets, topics = sealed_values({"ledger": ledger, "sessions": store})
    for aggregates in AGGREGATES.values():
        for aggregate in aggregates:
            for cls in event_classes(aggregate):
                assert get_topic(cls) in topics, f"{cls.__qualname__} was not written"
    for policy in POLICIES.values():
        for shot in policy.snapshots:
            assert any(name.startswith(f"snapshot {shot.topic}.") for name in secrets)
    # Each declared field carried something recognizable, so the scan below means something.
    for spec in (*DELIVERY_PRIVACY.events, *SESSION_PRIVACY.events):
        for path in spec.fields:
            name = f"{spec.event.__qualname__}.{path}"
            assert secrets.get(name), f"the test wrote no recognizable value in {name}"

    raw = store_bytes(store_location, ledger, store)
    assert b"o-all" in raw  # the scan does see the store
    for name, found in sorted(secrets.items()):
        for value in found:
            assert value.encode() not in raw, f"{name} = {value!r} is in clear at rest"


class _ClearReceiptsLedger(DeliveryLedger):
    """A ledger as it was before part receipts were sealed (ADR 0028)."""

    name = DeliveryLedger.name  # the same stored identity (tables, topics)

    privacy_policy = PrivacyPolicy(
        *(e for e in DELIVERY_PRIVACY.events if e.event is not DeliveryObligation.PartDelivered),  # type: ignore[attr-defined]
        *DELIVERY_PRIVACY.in_clear,
    )


def test_a_store_with_part_receipts_in_clear_still_reads(store_location: str) -> None:
    from gateway_ledger.infrastructure.eventstore.store import opening, store_environment

    with opening(store_location):
        old = _ClearReceiptsLedger(store_environment(store_location))
    oid = old.record_obligation(
        obligation_id="o-old", session_key="agent:main:x:dm:1", platform="x", chat_id="1",
        content="abc", parts=["a", "b", "c"],
    )  # fmt: skip
    old.mark_attempting(oid)
    obligation: Any = old.repository.get(DeliveryObligation.create_id(oid))
    obligation.acknowledge_part(by=old.owner, now=old.clock(), index=0, receipt=["clear-rcpt-1"])
    old.save(obligation)
    assert b"clear-rcpt-1" in store_bytes(store_location, old)  # the old format, in clear

    ledger = DeliveryLedger.open(store_location)
    (part,) = [h for h in ledger.history(oid) if h.type == "PartDelivered"]
    assert part.fields["receipt"] == ["clear-rcpt-1"]
    obligation = ledger.repository.get(DeliveryObligation.create_id(oid))
    obligation.acknowledge_part(
        by=ledger.owner, now=ledger.clock(), index=1, receipt=["sealed-part-rcpt-2"]
    )
    ledger.save(obligation)
    ledger.mark_delivered(oid, ["sealed-rcpt-3"])
    fresh = DeliveryLedger.open(store_location)
    receipts = [h.fields["receipt"] for h in fresh.history(oid) if "receipt" in h.fields]
    assert receipts == [["clear-rcpt-1"], ["sealed-part-rcpt-2"], ["sealed-rcpt-3"]]
    raw = store_bytes(store_location, ledger, fresh)
    assert b"sealed-part-rcpt-2" not in raw and b"sealed-rcpt-3" not in raw
