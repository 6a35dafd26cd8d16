"""The DeliveryObligation aggregate on its own: legal transitions, refusals, the marker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic, resolve_topic

from gateway_ledger.domain.delivery.marker import send_guard
from gateway_ledger.domain.delivery.obligation import DeliveryObligation, compute_obligation_id
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
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

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALICE = OwnerIdentity(host="h1", boot_id="b", pid=10, start_time=100)
BOB = OwnerIdentity(host="h1", boot_id="b", pid=11, start_time=200)
POLICY = LedgerPolicy()


def new(content: str = "hi") -> DeliveryObligation:
    agg = DeliveryObligation.record(
        obligation_id=compute_obligation_id("k", "m", content),
        session_key="k",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content=content,
        owner=ALICE,
        now=T0,
    )
    agg.collect_events()
    return agg


def test_compute_obligation_id_is_upstream_formula() -> None:
    import hashlib

    expected = hashlib.sha256(b"agent:main:telegram:dm:99|4711|Hello").hexdigest()[:24]
    assert compute_obligation_id("agent:main:telegram:dm:99", "4711", "Hello") == expected
    assert len(expected) == 24
    # lone surrogates are hashed with "replace", exactly like upstream
    assert (
        compute_obligation_id("k", "", "\ud800")
        == (hashlib.sha256("k||\ud800".encode("utf-8", "replace")).hexdigest()[:24])
    )
    # distinct threads on one chat never collide
    assert compute_obligation_id("a:t1", "m", "x") != compute_obligation_id("a:t2", "m", "x")


STORED_EVENTS = (
    "Recorded",
    "Attempting",
    "Delivered",
    "PartDelivered",
    "Failed",
    "LateResultReported",
    "Claimed",
    "RetryRequested",
    "DeadLetterRetried",
    "Abandoned",
    "Quarantined",
    "Reconciled",
    "StatusReported",
    "Imported",
    "Waited",
    "OrderReleased",
    "RecoverySendStarted",
)


def test_every_event_class_keeps_its_stored_topic() -> None:
    """Stores name each event by this topic: the class names and the module they are
    stored under never change, wherever the code moves (ADR 0039)."""
    events = {
        name
        for name, value in vars(DeliveryObligation).items()
        if isinstance(value, type) and issubclass(value, DeliveryObligation.Event)
    }
    # "Created" is the library's own, made for every aggregate and never triggered here.
    assert events == {"Event", "Created", *STORED_EVENTS}
    for name in STORED_EVENTS:
        topic = f"gateway_ledger.domain.obligation:DeliveryObligation.{name}"
        assert get_topic(getattr(DeliveryObligation, name)) == topic
        assert resolve_topic(topic) is getattr(DeliveryObligation, name)


def test_a_send_records_its_guard_and_a_bad_one_is_refused_before_any_event() -> None:
    agg = new()
    with pytest.raises(InvalidInput, match="unknown send guard 'hope'"):
        agg.start_attempt(by=ALICE, now=T0, guard="hope")
    assert agg.collect_events() == [] and agg.state is ObligationState.PENDING
    agg.start_attempt(by=ALICE, now=T0, guard=SendGuard.NONE)
    agg.fail(by=ALICE, now=T0, error="timeout", classification=ErrorClass.AMBIGUOUS)
    agg.start_attempt(by=ALICE, now=T0, guard="marker")
    agg.fail(by=ALICE, now=T0, error="timeout", classification=ErrorClass.AMBIGUOUS)
    agg.start_attempt(by=ALICE, now=T0)  # the synchronous API says nothing
    guards = [e.guard for e in agg.collect_events() if type(e).__name__ == "Attempting"]
    assert guards == ["none", "marker", None]


@pytest.mark.parametrize(
    ("may_have_arrived", "native", "expected"),
    [
        (False, False, SendGuard.NONE),
        (True, False, SendGuard.MARKER),
        (False, True, SendGuard.IDEMPOTENCY_KEY),
        (True, True, SendGuard.IDEMPOTENCY_KEY),
    ],
)
def test_the_guard_rule(may_have_arrived: bool, native: bool, expected: SendGuard) -> None:
    assert send_guard(may_have_arrived=may_have_arrived, native_idempotency=native) is expected


def test_happy_path_and_retry() -> None:
    agg = new()
    agg.start_attempt(by=ALICE, now=T0)
    agg.fail(by=ALICE, now=T0, error="503", classification=ErrorClass.AMBIGUOUS)
    agg.start_attempt(by=ALICE, now=T0)
    agg.confirm_delivery(by=ALICE, now=T0, receipt=["m-1"])
    names = [type(e).__name__ for e in agg.collect_events()]
    assert names == ["Attempting", "Failed", "Attempting", "Delivered"]
    assert agg.state is ObligationState.DELIVERED
    assert agg.receipt == ["m-1"]


@pytest.mark.parametrize(
    "prepare, command",
    [
        ([], "deliver"),  # pending -> delivered skips the send
        ([], "fail"),
        (["attempt"], "attempt"),
        (["attempt", "deliver"], "attempt"),
        (["attempt", "deliver"], "fail"),
        (["attempt", "deliver"], "claim"),
        (["attempt", "deliver"], "abandon"),
        (["abandon"], "attempt"),
        (["abandon"], "claim"),
        (["abandon"], "deliver"),
        (["claim"], "attempt"),  # the claimer sends directly: claimed -> delivered|failed
    ],
)
def test_illegal_transitions_are_refused_and_append_nothing(
    prepare: list[str], command: str
) -> None:
    agg = new()
    run = {
        "attempt": lambda: agg.start_attempt(by=agg.owner, now=T0),
        "deliver": lambda: agg.confirm_delivery(by=agg.owner, now=T0),
        "fail": lambda: agg.fail(by=agg.owner, now=T0, error="x"),
        "claim": lambda: agg.claim(by=BOB if agg.owner == ALICE else ALICE, now=T0, policy=POLICY),
        "abandon": lambda: agg.abandon(reason=AbandonReason.OPERATOR, now=T0, detail="stop"),
    }
    for step in prepare:
        run[step]()
    agg.collect_events()
    version, state = agg.version, agg.state
    with pytest.raises(IllegalTransition) as info:
        run[command]()
    assert agg.obligation_id in str(info.value)
    assert state.value in str(info.value)
    assert agg.collect_events() == []
    assert (agg.version, agg.state) == (version, state)


def test_marker_is_false_only_when_no_send_can_have_started() -> None:
    agg = new()
    assert agg.needs_marker is False
    agg.start_attempt(by=ALICE, now=T0)
    assert agg.needs_marker is True


def test_definite_rejection_clears_the_flag_raised_by_its_own_send() -> None:
    agg = new()
    agg.start_attempt(by=ALICE, now=T0)
    agg.fail(by=ALICE, now=T0, error="400 bad request", classification=ErrorClass.REJECTED)
    assert agg.needs_marker is False
    agg.start_attempt(by=ALICE, now=T0)
    agg.fail(by=ALICE, now=T0, error="timeout", classification=ErrorClass.AMBIGUOUS)
    agg.start_attempt(by=ALICE, now=T0)
    agg.fail(by=ALICE, now=T0, error="429", classification=ErrorClass.RATE_LIMITED)
    assert agg.needs_marker is True  # the ambiguous send before may have arrived


def test_claim_from_pending_needs_no_marker_but_a_second_claim_does() -> None:
    agg = new()
    agg.claim(by=BOB, now=T0, policy=POLICY)
    claimed = agg.collect_events()[-1]
    assert claimed.needs_marker is False  # type: ignore[attr-defined]
    carol = OwnerIdentity(host="h2", boot_id="c", pid=12, start_time=1)
    agg.claim(by=carol, now=T0, policy=POLICY)
    assert agg.collect_events()[-1].needs_marker is True  # type: ignore[attr-defined]
    assert agg.fence == 2 and agg.recovery_attempts == 2


def test_claim_is_capped_and_never_by_the_owner() -> None:
    agg = new()
    with pytest.raises(IllegalTransition, match="never claims its own"):
        agg.claim(by=ALICE, now=T0, policy=POLICY)
    owners = [OwnerIdentity(host="h", boot_id="b", pid=100 + i, start_time=i) for i in range(4)]
    for o in owners[:3]:
        agg.claim(by=o, now=T0, policy=POLICY)
    with pytest.raises(IllegalTransition, match="3 recovery claims"):
        agg.claim(by=owners[3], now=T0, policy=POLICY)


def test_a_fenced_out_owner_cannot_start_a_send() -> None:
    agg = new()
    agg.start_attempt(by=ALICE, now=T0)
    agg.claim(by=BOB, now=T0, policy=POLICY)
    agg.fail(by=BOB, now=T0, error="timeout")
    with pytest.raises(IllegalTransition, match="fenced out"):
        agg.start_attempt(by=ALICE, now=T0)
    agg.start_attempt(by=BOB, now=T0)


def test_abandon_from_every_unresolved_state() -> None:
    for steps in ([], ["attempt"], ["attempt", "fail"], ["claim"]):
        agg = new()
        for step in steps:
            if step == "attempt":
                agg.start_attempt(by=ALICE, now=T0)
            elif step == "fail":
                agg.fail(by=ALICE, now=T0, error="e")
            else:
                agg.claim(by=BOB, now=T0, policy=POLICY)
        agg.abandon(reason=AbandonReason.STALE, now=T0 + timedelta(days=1))
        assert agg.state is ObligationState.ABANDONED
        assert agg.abandon_reason is AbandonReason.STALE


def test_error_text_is_cut_to_500_characters() -> None:
    agg = new()
    agg.start_attempt(by=ALICE, now=T0)
    agg.fail(by=ALICE, now=T0, error="x" * 2000)
    assert len(agg.last_error) == 500


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"session_key": ""}, "session_key must not be empty"),
        ({"session_key": 5}, "session_key must be a str"),
        ({"content": "\ud800"}, "content is not valid Unicode"),
        ({"content": None}, "content must be a str"),
        ({"now": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"metadata": {"a": object()}}, "JSON cannot carry"),
        ({"metadata": {1: "x"}}, "keys must be str"),
        ({"metadata": {"_type_": "datetime_iso", "_data_": "x"}}, "reserved"),
        ({"metadata": {"n": 2**70}}, "64-bit"),
        ({"parts": ["h"]}, "parts must be the content split"),
    ],
)
def test_bad_input_is_refused_before_any_event(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "obligation_id": "abc",
        "session_key": "k",
        "target": DeliveryTarget(platform="telegram", chat_id="1"),
        "content": "hi",
        "owner": ALICE,
        "now": T0,
    }
    args.update(kwargs)
    with pytest.raises(InvalidInput, match=message):
        DeliveryObligation.record(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"platform": ""}, "platform must not be empty"),
        ({"platform": None}, "platform must be a str"),
        ({"chat_id": ""}, "chat_id must not be empty"),
        ({"chat_id": 3.5}, "chat_id must be a str"),
        ({"thread_id": "\udfff"}, "thread_id is not valid Unicode"),
    ],
)
def test_target_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"platform": "telegram", "chat_id": "1"}
    args.update(kwargs)
    with pytest.raises(InvalidInput, match=message):
        DeliveryTarget(**args)  # type: ignore[arg-type]


def test_numeric_chat_id_is_kept_as_string() -> None:
    assert DeliveryTarget(platform="telegram", chat_id=-100123).chat_id == "-100123"  # type: ignore[arg-type]


def test_a_commands_events_leave_what_the_librarys_trigger_and_a_replay_leave() -> None:
    """``DeliveryObligation.trigger_event`` skips the library's generic steps; the state it
    leaves must be the library's: replayed through ``mutate`` (as a load does) and
    triggered through the library's own ``trigger_event``, the same events give the same
    aggregate (this pins the override to the library version installed)."""
    later = T0 + timedelta(seconds=1)

    def lifecycle(agg: DeliveryObligation) -> None:
        agg.start_attempt(by=ALICE, now=T0, guard=SendGuard.NONE)
        agg.fail(by=ALICE, now=later, error="503", classification=ErrorClass.AMBIGUOUS)
        agg.claim(by=BOB, now=later, policy=POLICY)
        agg.confirm_delivery(by=BOB, now=later + timedelta(seconds=1), receipt=["m-1"])

    ours = DeliveryObligation.record(
        obligation_id=compute_obligation_id("k", "m", "hi"),
        session_key="k",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="hi",
        owner=ALICE,
        now=T0,
    )
    first = ours.collect_events()
    lifecycle(ours)
    events = list(ours.collect_events())
    assert [type(e).__name__ for e in events] == ["Attempting", "Failed", "Claimed", "Delivered"]

    replayed = None
    for event in [*first, *events]:
        replayed = event.mutate(replayed)
    assert replayed is not None and vars(replayed) == vars(ours)

    library = first[0].mutate(None)
    for event in events:
        fields = {
            k: v
            for k, v in vars(event).items()
            if k not in ("originator_id", "originator_version", "timestamp")
        }
        Aggregate.trigger_event(library, type(event), timestamp=event.timestamp, **fields)
    assert library.collect_events() == events
    assert vars(library) == vars(ours)


def test_a_recorded_obligation_is_what_the_librarys_create_makes() -> None:
    """``DeliveryObligation.record`` builds its ``Recorded`` without the library's generic
    ``_create`` steps; the event and the aggregate must be what ``_create`` makes of the
    same fields (this pins the shortcut to the library version installed)."""
    fields: dict[str, Any] = {
        "obligation_id": compute_obligation_id("k", "m", "hi there"),
        "session_key": "k",
        "target": DeliveryTarget(platform="telegram", chat_id="1", thread_id="t", reply_to="r"),
        "content": "hi there",
        "parts": ["hi ", "there"],
        "media": [MediaItem(kind="image", uri="file:///tmp/a.png", caption="c")],
        "metadata": {"a": 1},
        "owner": ALICE,
    }
    ours = DeliveryObligation.record(now=T0, **fields)
    library = DeliveryObligation._create(
        DeliveryObligation.Recorded,
        id=DeliveryObligation.create_id(fields["obligation_id"]),
        timestamp=T0,
        **fields,
    )
    assert ours.collect_events() == library.collect_events()
    assert vars(ours) == vars(library)
    assert (ours.id, ours.version, ours.created_on, ours.modified_on) == (
        library.id,
        library.version,
        T0,
        T0,
    )
