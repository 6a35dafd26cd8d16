"""The DeliveryObligation's rules one by one, on the pure aggregate (no store).

Each test names a rule of ADR 0006 (the duplicate marker), ADR 0010 (fencing) or the
operator's commands, and drives it through the aggregate's commands only. Every test also
rebuilds the aggregate from its own events and compares it with the live one, so an
event's ``apply`` that mutates differently on a reload than it did the first time is caught
wherever it hides. Written so that ``tools/mutate_domain.py`` finds no change of behaviour
that every test still passes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest

from gateway_ledger.domain.delivery.obligation import (
    RECORD_FIELDS,
    DeliveryObligation,
    compute_obligation_id,
    obligation_uuid,
    record_differences,
)
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A = OwnerIdentity(host="gw-a", boot_id="b", pid=10, start_time=100)
B = OwnerIdentity(host="gw-b", boot_id="b", pid=11, start_time=200)
C = OwnerIdentity(host="gw-c", boot_id="c", pid=12, start_time=300)
OPERATOR = OwnerIdentity(host="ops", boot_id="o", pid=99, start_time=1)
POLICY = LedgerPolicy()
TARGET = DeliveryTarget(platform="telegram", chat_id="1")
EIGHT_MIB = 8 * 1024 * 1024  # written out: the limit is a promise, not an implementation detail


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def record(content: str = "hi", **kwargs: Any) -> DeliveryObligation:
    args: dict[str, Any] = {
        "obligation_id": compute_obligation_id("k", "m", content),
        "session_key": "k",
        "target": TARGET,
        "content": content,
        "owner": A,
        "now": T0,
    }
    args.update(kwargs)
    return DeliveryObligation.record(**args)


def public_state(agg: DeliveryObligation) -> dict[str, Any]:
    state = {k: v for k, v in vars(agg).items() if not k.startswith("_")}
    state["version"] = agg.version
    return state


def names(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


class Tracked:
    """An aggregate plus every event it triggered, so a test can check the replay."""

    def __init__(self, agg: DeliveryObligation) -> None:
        self.agg = agg
        self.events: list[Any] = []

    def new_events(self) -> list[Any]:
        fresh = self.agg.collect_events()
        self.events.extend(fresh)
        return fresh

    def replayed(self) -> DeliveryObligation:
        self.new_events()
        agg: Any = None
        for e in self.events:
            agg = e.mutate(agg)
        return agg  # type: ignore[no-any-return]

    def check_replay(self) -> None:
        assert public_state(self.replayed()) == public_state(self.agg)


@pytest.fixture
def track() -> Iterator[Any]:
    made: list[Tracked] = []

    def make(agg: DeliveryObligation) -> Tracked:
        t = Tracked(agg)
        made.append(t)
        return t

    yield make
    for t in made:  # every test's history rebuilds the very same aggregate
        t.check_replay()


# -- identity ------------------------------------------------------------------------------


def test_the_aggregate_id_is_stable_across_versions() -> None:
    # Stored events are keyed by it: a different namespace would orphan every stored reply.
    assert obligation_uuid("0123456789abcdef01234567") == UUID(
        "cdc1e986-ec7e-594c-bb25-d9a0d8aec39a"
    )
    oid = compute_obligation_id("k", "m", "hi")
    assert record().id == obligation_uuid(oid) == DeliveryObligation.create_id(oid)
    assert obligation_uuid("a") != obligation_uuid("b")


def test_the_obligation_id_hashes_every_field_with_its_separator() -> None:
    # "a|b" + "c" and "a" + "b|c" are different turns; so are the separators' positions.
    assert compute_obligation_id("a", "b", "c") != compute_obligation_id("a", "", "bc")
    assert compute_obligation_id("ab", "", "c") != compute_obligation_id("a", "b", "c")
    assert compute_obligation_id("a", "bc", "") != compute_obligation_id("a", "b", "c")


# -- recording -----------------------------------------------------------------------------


def test_a_new_obligation_starts_pending_owned_by_its_recorder_with_nothing_sent(
    track: Any,
) -> None:
    media = [MediaItem(kind="image", uri="file:///a.png")]
    agg = record("hello world", parts=["hello ", "world"], media=media, metadata={"n": 1})
    track(agg)
    assert agg.obligation_id == compute_obligation_id("k", "m", "hello world")
    assert (agg.session_key, agg.target, agg.platform) == ("k", TARGET, "telegram")
    assert (agg.content, agg.parts, agg.media, agg.metadata) == (
        "hello world",
        ["hello ", "world"],
        media,
        {"n": 1},
    )
    assert agg.owner == A and agg.recorded_at == T0 == agg.last_transition_at
    assert agg.state is ObligationState.PENDING and not agg.is_resolved
    assert (agg.recovery_attempts, agg.send_attempts, agg.fence) == (0, 0, 0)
    assert agg.may_have_arrived is False and agg.arrived_before_this_send is False
    assert agg.needs_marker is False
    assert (agg.last_error, agg.error_class, agg.retry_after) == ("", None, None)
    assert (agg.receipt, agg.delivered_parts, agg.abandon_reason) == ([], {}, None)
    assert agg.version == 1


def test_an_obligation_id_of_200_characters_is_the_longest_accepted() -> None:
    assert record(obligation_id="x" * 200).obligation_id == "x" * 200
    with pytest.raises(InvalidInput, match="longer than 200"):
        record(obligation_id="x" * 201)
    with pytest.raises(InvalidInput):
        record(obligation_id="")


def test_content_may_be_empty_and_up_to_eight_mib_of_utf8() -> None:
    assert record("").content == ""
    assert len(record("a" * EIGHT_MIB).content) == EIGHT_MIB
    with pytest.raises(InvalidInput, match="larger than"):
        record("a" * (EIGHT_MIB + 1))


def test_the_content_cap_counts_encoded_bytes_not_characters() -> None:
    # 2-byte characters: the character count times four passes the cheap pre-check, yet
    # the encoded size is exactly the cap, so the reply is accepted.
    at_cap = "é" * (EIGHT_MIB // 2)
    assert len(at_cap) * 4 > EIGHT_MIB and len(at_cap.encode()) == EIGHT_MIB
    assert record(at_cap).content == at_cap
    with pytest.raises(InvalidInput, match="larger than"):
        record(at_cap + "é")


def test_recording_refuses_what_is_not_a_target_an_owner_or_a_time() -> None:
    with pytest.raises(InvalidInput, match="DeliveryTarget"):
        record(target=("telegram", "1"))
    with pytest.raises(InvalidInput, match="OwnerIdentity"):
        record(owner="gw-a")
    with pytest.raises(InvalidInput, match="timezone-aware"):
        record(now=datetime(2026, 1, 1))
    with pytest.raises(InvalidInput, match="session_key"):
        record(session_key="")


def test_parts_are_the_content_split_in_order_and_may_include_empty_chunks() -> None:
    assert record("hi", parts=["", "h", "i"]).parts == ["", "h", "i"]
    assert record("hi", parts=("h", "i")).parts == ["h", "i"]
    for bad in ("hi", b"hi", {"h", "i"}, iter(["h", "i"]), 5):
        with pytest.raises(InvalidInput, match="parts must be a sequence"):
            record("hi", parts=bad)
    with pytest.raises(InvalidInput, match="split in order"):
        record("hi", parts=["i", "h"])
    with pytest.raises(InvalidInput, match="parts"):
        record("hi", parts=["h", 1])


def test_media_are_media_items_in_any_iterable() -> None:
    item = MediaItem(kind="image", uri="u")
    assert record(media=(item,)).media == [item]
    assert record(media=iter([item])).media == [item]
    for bad in ("u", b"u", {"kind": "image"}, 5):
        with pytest.raises(InvalidInput, match="media must be a list"):
            record(media=bad)
    with pytest.raises(InvalidInput, match="MediaItem values"):
        record(media=[item, "u"])


def test_metadata_is_kept_as_given_and_must_be_a_json_mapping() -> None:
    assert record(metadata=None).metadata == {}
    assert record(metadata={"a": [1, "x"]}).metadata == {"a": [1, "x"]}
    with pytest.raises(InvalidInput, match="metadata must be a mapping"):
        record(metadata=[("a", 1)])
    with pytest.raises(InvalidInput, match="JSON cannot carry"):
        record(metadata={"a": {1, 2}})


def test_part_count_is_text_chunks_or_one_whole_text_then_media() -> None:
    item = MediaItem(kind="image", uri="u")
    assert record("abc", parts=["a", "b", "c"]).part_count == 3
    assert record("abc").part_count == 1
    assert record("").part_count == 0
    assert record("", media=[item, item]).part_count == 2
    assert record("abc", media=[item, item]).part_count == 3
    assert record("ab", parts=["a", "b"], media=[item]).part_count == 3


# -- sending -------------------------------------------------------------------------------


def test_starting_a_send_makes_the_sender_the_owner_before_any_claim(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=B, now=at(1))  # before a claim, any process may send
    assert agg.owner == B and agg.state is ObligationState.ATTEMPTING
    assert (agg.send_attempts, agg.last_transition_at) == (1, at(1))
    agg.fail(by=B, now=at(2), error="timeout")
    with pytest.raises(IllegalTransition, match="never claims its own"):
        agg.claim(by=B, now=at(3), policy=POLICY)
    agg.claim(by=A, now=at(3), policy=POLICY)  # the recorder is no longer the owner
    assert agg.owner == A


def test_each_send_is_counted_and_clears_the_platforms_retry_after(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.fail(by=A, now=at(2), classification=ErrorClass.RATE_LIMITED, retry_after=30)
    assert agg.retry_after == 30.0 and isinstance(agg.retry_after, float)
    assert agg.error_class is ErrorClass.RATE_LIMITED and agg.last_transition_at == at(2)
    agg.start_attempt(by=A, now=at(3))
    assert agg.retry_after is None and agg.send_attempts == 2
    agg.fail(by=A, now=at(4), error="boom")
    assert agg.retry_after is None and agg.last_error == "boom"
    assert agg.error_class is ErrorClass.AMBIGUOUS  # the default judgement
    agg.start_attempt(by=A, now=at(5))
    agg.fail(by=A, now=at(6))
    assert agg.last_error == ""  # no text given: none kept


def test_a_send_is_confirmed_with_its_receipt(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.confirm_delivery(by=A, now=at(2), receipt=[7, "m-8"])
    assert agg.state is ObligationState.DELIVERED and agg.is_resolved
    assert agg.receipt == ["7", "m-8"] and agg.last_transition_at == at(2)
    assert names(t.new_events()) == ["Recorded", "Attempting", "Delivered"]


def test_a_receipt_is_a_list_of_message_ids() -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    for bad in ("m-1", [None], [True], [""]):
        with pytest.raises(InvalidInput, match="receipt"):
            agg.confirm_delivery(by=A, now=at(2), receipt=bad)
    assert agg.state is ObligationState.ATTEMPTING


@pytest.mark.parametrize("retry_after", [0, 0.5, 15, 900.0])
def test_retry_after_is_any_finite_non_negative_number(retry_after: float) -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    agg.fail(by=A, now=at(2), classification="rate_limited", retry_after=retry_after)
    assert agg.retry_after == float(retry_after)


@pytest.mark.parametrize("retry_after", [-1, -0.001, math.inf, math.nan, True, "5"])
def test_a_bad_retry_after_is_refused_before_any_event(retry_after: object) -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    agg.collect_events()
    with pytest.raises(InvalidInput, match="retry_after"):
        agg.fail(by=A, now=at(2), retry_after=retry_after)  # type: ignore[arg-type]
    assert agg.collect_events() == [] and agg.state is ObligationState.ATTEMPTING


def test_a_failure_needs_text_and_a_known_classification() -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    with pytest.raises(InvalidInput, match="error must be a str"):
        agg.fail(by=A, now=at(2), error=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="classification"):
        agg.fail(by=A, now=at(2), classification="maybe")  # type: ignore[arg-type]
    agg.fail(by=A, now=at(2), error="bad \ud800 byte")  # kept, never refused
    assert agg.last_error == "bad ? byte"


@pytest.mark.parametrize(
    ("classification", "marker_after"),
    [
        (ErrorClass.AMBIGUOUS, True),
        (ErrorClass.REJECTED, False),
        (ErrorClass.RATE_LIMITED, False),
        (ErrorClass.DEAD_TARGET, False),
    ],
)
def test_only_an_ambiguous_failure_leaves_the_first_send_possibly_arrived(
    classification: ErrorClass, marker_after: bool, track: Any
) -> None:
    t = track(record())
    t.agg.start_attempt(by=A, now=at(1))
    t.agg.fail(by=A, now=at(2), classification=classification)
    assert t.agg.needs_marker is marker_after
    assert t.agg.state is ObligationState.FAILED


# -- multi-part replies --------------------------------------------------------------------


def test_each_part_is_confirmed_once_with_its_receipt(track: Any) -> None:
    t = track(record("abc", parts=["a", "b", "c"]))
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.acknowledge_part(by=A, now=at(2), index=0, receipt=["m-0"])
    agg.acknowledge_part(by=A, now=at(3), index=2, receipt=[12])
    assert agg.delivered_parts == {"0": ["m-0"], "2": ["12"]}
    assert [agg.part_delivered(i) for i in range(3)] == [True, False, True]
    assert agg.last_transition_at == at(3) and agg.state is ObligationState.ATTEMPTING
    assert names(t.new_events())[-2:] == ["PartDelivered", "PartDelivered"]
    with pytest.raises(IllegalTransition, match="already confirmed"):
        agg.acknowledge_part(by=A, now=at(4), index=2, receipt=["m-2 again"])
    assert t.new_events() == [] and agg.delivered_parts["2"] == ["12"]


def test_a_part_index_must_name_a_part_of_this_reply() -> None:
    agg = record("abc", parts=["a", "b", "c"])
    agg.start_attempt(by=A, now=at(1))
    agg.collect_events()
    for bad in (3, -1, 4):
        with pytest.raises(InvalidInput, match=r"outside 0\.\.2"):
            agg.acknowledge_part(by=A, now=at(2), index=bad)
    for wrong_type in (True, "1", 1.0):
        with pytest.raises(InvalidInput, match="must be an int"):
            agg.acknowledge_part(by=A, now=at(2), index=wrong_type)  # type: ignore[arg-type]
    assert agg.collect_events() == [] and agg.delivered_parts == {}
    agg.acknowledge_part(by=A, now=at(2), index=2)  # the last one is a part
    agg.acknowledge_part(by=A, now=at(2), index=0)  # so is the first


def test_parts_are_confirmed_only_while_a_send_is_under_way() -> None:
    agg = record("ab", parts=["a", "b"])
    with pytest.raises(IllegalTransition, match="part 0 delivered"):
        agg.acknowledge_part(by=A, now=at(1), index=0)
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.acknowledge_part(by=B, now=at(2), index=0)  # the claimer sends at once
    assert agg.part_delivered(0)


# -- fencing (ADR 0010) --------------------------------------------------------------------


def test_an_explicit_reporter_fence_decides_even_for_the_current_owner(track: Any) -> None:
    """A's first send (fence 0) reports after B and then A itself claimed (fence 2): A is
    the owner again, but that result belongs to a superseded send, so it is late."""
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.claim(by=B, now=at(2), policy=POLICY)
    agg.claim(by=A, now=at(3), policy=POLICY)
    assert (agg.owner, agg.fence) == (A, 2)
    t.new_events()
    agg.confirm_delivery(by=A, now=at(4), receipt=["old"], fence=0)
    assert agg.state is ObligationState.CLAIMED and agg.receipt == []
    (late,) = t.new_events()
    assert type(late).__name__ == "LateResultReported"
    assert (late.outcome, late.fence, late.current_fence, late.late) == ("delivered", 0, 2, True)
    agg.fail(by=A, now=at(5), error="old", fence=1)
    assert agg.state is ObligationState.CLAIMED
    agg.confirm_delivery(by=A, now=at(6), fence=2)  # the current send's own result
    assert agg.state is ObligationState.DELIVERED


def test_a_reporter_holding_the_current_fence_speaks_whoever_owns_it(track: Any) -> None:
    t = track(record("ab", parts=["a", "b"]))
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.acknowledge_part(by=C, now=at(2), index=0, fence=1)
    assert agg.part_delivered(0)
    agg.fail(by=C, now=at(3), error="e", fence=1, classification="rejected")
    assert agg.state is ObligationState.FAILED
    assert "LateResultReported" not in names(t.new_events())


def test_before_any_claim_every_reporter_speaks_for_the_send(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    assert not agg.is_fenced_out(B) and not agg.is_fenced_out(B, 0)
    agg.fail(by=B, now=at(2), classification="rejected", fence=0)
    assert agg.state is ObligationState.FAILED and agg.needs_marker is False


def test_without_a_fence_only_the_owner_speaks_after_a_claim() -> None:
    agg = record()
    agg.claim(by=B, now=at(1), policy=POLICY)
    assert agg.is_fenced_out(A) and agg.is_fenced_out(C) and not agg.is_fenced_out(B)
    assert agg.is_fenced_out(B, 0) and not agg.is_fenced_out(A, 1)


@pytest.mark.parametrize("fence", [-1, True, "1", 1.0])
def test_a_reporter_fence_is_a_non_negative_int(fence: object) -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    agg.collect_events()
    with pytest.raises(InvalidInput, match="fence"):
        agg.confirm_delivery(by=A, now=at(2), fence=fence)  # type: ignore[arg-type]
    assert agg.collect_events() == [] and agg.state is ObligationState.ATTEMPTING


def test_late_results_are_history_never_transitions(track: Any) -> None:
    t = track(record("ab", parts=["a", "b"]))
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.claim(by=B, now=at(2), policy=POLICY)
    t.new_events()
    before = public_state(agg)
    agg.acknowledge_part(by=A, now=at(3), index=1, receipt=[5])
    agg.fail(by=A, now=at(4), error="e" * 600, classification=ErrorClass.DEAD_TARGET)
    agg.confirm_delivery(by=A, now=at(5), receipt=["m"])
    after = public_state(agg)
    assert after.pop("version") == before.pop("version") + 3
    assert after == before  # A's send had started already: the flags were set
    part, failed, delivered = t.new_events()
    assert (part.outcome, part.part, part.receipt) == ("part_delivered", 1, ["5"])
    assert (failed.outcome, failed.classification, failed.error) == (
        "failed",
        "dead_target",
        "e" * 500,
    )
    assert (delivered.outcome, delivered.receipt, delivered.part) == ("delivered", ["m"], None)
    assert (delivered.error, delivered.classification) == ("", None)
    assert (part.error, part.classification, failed.receipt) == ("", None, [])
    for late in (part, failed, delivered):
        assert (late.by, late.fence, late.current_fence, late.late) == (A, None, 1, True)
        assert late.timestamp in (at(3), at(4), at(5))


def test_a_late_success_makes_every_later_send_a_possible_duplicate(track: Any) -> None:
    """Record; B claims; A's late success; B's send refused: the reply is known to have
    arrived, so a re-send may only go out with the marker."""
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.confirm_delivery(by=A, now=at(2), receipt=["a-1"])
    agg.fail(by=B, now=at(3), classification=ErrorClass.REJECTED)
    assert agg.needs_marker is True
    agg.start_attempt(by=B, now=at(4))
    agg.fail(by=B, now=at(5), classification=ErrorClass.REJECTED)
    assert agg.needs_marker is True
    agg.claim(by=C, now=at(6), policy=POLICY)
    assert t.new_events()[-1].needs_marker is True


def test_a_late_success_after_a_refused_resend_raises_the_marker_at_once(track: Any) -> None:
    """Record; B claims; B's send is refused (nothing may have arrived); A's late success:
    the reply did arrive, so the marker is due before B even starts again."""
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.fail(by=B, now=at(2), classification=ErrorClass.REJECTED)
    assert agg.needs_marker is False
    agg.confirm_delivery(by=A, now=at(3), receipt=["a-1"])
    assert agg.needs_marker is True
    agg.claim(by=C, now=at(4), policy=POLICY)
    assert t.new_events()[-1].needs_marker is True


def test_a_late_failure_proves_nothing_arrived(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.fail(by=A, now=at(2), classification=ErrorClass.AMBIGUOUS)  # late
    agg.acknowledge_part(by=A, now=at(2), index=0)  # late, and only a part
    agg.fail(by=B, now=at(3), classification=ErrorClass.REJECTED)
    assert agg.needs_marker is False


def test_a_late_success_arriving_before_any_send_is_remembered(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY)
    agg.confirm_delivery(by=A, now=at(2), fence=0)
    assert (agg.may_have_arrived, agg.arrived_before_this_send) == (True, True)


# -- claims --------------------------------------------------------------------------------


def test_a_claim_takes_ownership_and_records_what_it_took_over(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    t.new_events()
    agg.claim(by=B, now=at(2), policy=POLICY)
    (claimed,) = t.new_events()
    assert (claimed.by, claimed.previous_owner) == (B, A)
    assert (claimed.recovery_attempt, claimed.fence, claimed.needs_marker) == (1, 1, True)
    assert agg.state is ObligationState.CLAIMED and agg.owner == B
    assert (agg.recovery_attempts, agg.fence, agg.last_transition_at) == (1, 1, at(2))
    assert agg.needs_marker is True  # the claimer sends at once


def test_a_claim_after_a_refused_send_needs_no_marker(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.fail(by=A, now=at(2), classification=ErrorClass.REJECTED)
    t.new_events()
    agg.claim(by=B, now=at(3), policy=POLICY)
    assert t.new_events()[-1].needs_marker is False
    agg.fail(by=B, now=at(4), classification=ErrorClass.REJECTED)
    assert agg.needs_marker is False


def test_the_recovery_budget_is_the_policys_max_attempts() -> None:
    agg = record()
    with pytest.raises(IllegalTransition, match="0 recovery claims"):
        agg.claim(by=B, now=at(1), policy=LedgerPolicy(max_attempts=0))
    agg.claim(by=B, now=at(1), policy=LedgerPolicy(max_attempts=1))
    with pytest.raises(IllegalTransition, match="1 recovery claims"):
        agg.claim(by=C, now=at(2), policy=LedgerPolicy(max_attempts=1))
    agg.claim(by=C, now=at(2), policy=LedgerPolicy(max_attempts=2))
    assert agg.recovery_attempts == 2


def test_resolved_obligations_are_never_claimed_or_retried() -> None:
    agg = record()
    agg.abandon(reason=AbandonReason.STALE, now=at(1))
    with pytest.raises(IllegalTransition):
        agg.claim(by=B, now=at(2), policy=POLICY)
    with pytest.raises(IllegalTransition):
        agg.request_retry(by=OPERATOR, now=at(2))


# -- operator retry ------------------------------------------------------------------------


def test_an_operator_retry_restarts_the_recovery_budget_and_takes_ownership(
    track: Any,
) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    for i, owner in enumerate((B, C, B), start=2):
        agg.claim(by=owner, now=at(i), policy=POLICY)
    agg.fail(by=B, now=at(5), classification="rate_limited", retry_after=60)
    with pytest.raises(IllegalTransition, match="3 recovery claims"):
        agg.claim(by=A, now=at(6), policy=POLICY)
    t.new_events()
    agg.request_retry(by=OPERATOR, now=at(7), requested_by="alice@ops")
    (retry,) = t.new_events()
    assert (retry.by, retry.previous_owner, retry.requested_by, retry.fence) == (
        OPERATOR,
        B,
        "alice@ops",
        4,
    )
    assert agg.state is ObligationState.PENDING and agg.owner == OPERATOR
    assert (agg.recovery_attempts, agg.fence, agg.retry_after) == (0, 4, None)
    assert agg.last_transition_at == at(7)
    assert agg.needs_marker is True  # sends that may have arrived are still on record
    assert agg.is_fenced_out(B)  # the previous owner's results are late now
    with pytest.raises(IllegalTransition, match="fenced out"):
        agg.start_attempt(by=B, now=at(8))
    agg.claim(by=A, now=at(8), policy=POLICY)  # any gateway may claim it at once
    assert (agg.recovery_attempts, agg.fence, agg.owner) == (1, 5, A)


def test_a_retry_needs_no_operator_name_but_refuses_a_bad_one(track: Any) -> None:
    t = track(record())
    t.new_events()
    t.agg.request_retry(by=OPERATOR, now=at(1))
    assert t.agg.state is ObligationState.PENDING
    (retry,) = t.new_events()
    assert type(retry).__name__ == "RetryRequested" and retry.requested_by == ""
    with pytest.raises(InvalidInput, match="requested_by"):
        t.agg.request_retry(by=OPERATOR, now=at(2), requested_by=b"ops")  # type: ignore[arg-type]


def test_a_retry_is_allowed_from_every_unresolved_state() -> None:
    for steps in ([], ["attempt"], ["attempt", "fail"], ["claim"]):
        agg = record()
        for step in steps:
            if step == "attempt":
                agg.start_attempt(by=A, now=at(1))
            elif step == "fail":
                agg.fail(by=A, now=at(2))
            else:
                agg.claim(by=B, now=at(1), policy=POLICY)
        agg.request_retry(by=OPERATOR, now=at(3))
        assert agg.state is ObligationState.PENDING


# -- abandoning ----------------------------------------------------------------------------


def test_abandoning_records_the_reason_who_and_a_cut_detail(track: Any) -> None:
    t = track(record())
    agg = t.agg
    t.new_events()
    agg.abandon(reason="erased", now=at(1), by=OPERATOR, detail="d" * 700)
    (abandoned,) = t.new_events()
    assert (abandoned.reason, abandoned.by, abandoned.detail) == ("erased", OPERATOR, "d" * 500)
    assert agg.state is ObligationState.ABANDONED and agg.is_resolved
    assert agg.abandon_reason is AbandonReason.ERASED and agg.last_transition_at == at(1)
    other = record("other")
    other.collect_events()
    other.abandon(reason=AbandonReason.STALE, now=at(2))  # an operator must say why
    (plain,) = other.collect_events()
    assert (plain.detail, plain.by) == ("", None)
    with pytest.raises(InvalidInput, match="abandon reason must not be empty"):
        record("third").abandon(reason=AbandonReason.OPERATOR, now=at(3))


def test_abandoning_refuses_an_unknown_reason_or_a_non_text_detail() -> None:
    agg = record()
    with pytest.raises(InvalidInput, match="unknown abandon reason"):
        agg.abandon(reason="bored", now=at(1))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="detail"):
        agg.abandon(reason=AbandonReason.STALE, now=at(1), detail=5)  # type: ignore[arg-type]
    assert agg.state is ObligationState.PENDING and agg.version == 1


def test_an_operator_must_say_why_in_at_most_500_characters() -> None:
    agg = record()
    with pytest.raises(InvalidInput, match="abandon reason is longer than 500"):
        agg.abandon(reason=AbandonReason.OPERATOR, now=at(1), by=OPERATOR, detail="d" * 501)
    with pytest.raises(InvalidInput, match="abandon reason must not contain NUL"):
        agg.abandon(reason=AbandonReason.OPERATOR, now=at(1), by=OPERATOR, detail="why\x00")
    assert agg.version == 1
    agg.abandon(reason=AbandonReason.OPERATOR, now=at(1), by=OPERATOR, detail="d" * 500)
    assert agg.abandon_reason is AbandonReason.OPERATOR


# -- quarantine (ADR 0027: nothing unreadable is ever sent) ---------------------------------


def test_a_new_obligation_is_not_quarantined() -> None:
    agg = record()
    assert agg.is_quarantined is False and agg.quarantine_reason is None


def test_quarantine_keeps_the_state_takes_ownership_and_names_the_reason(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    t.new_events()
    agg.quarantine(reason="unreadable", found_at=2, by=B, now=at(2))
    (event,) = t.new_events()
    assert type(event).__name__ == "Quarantined"  # a stored topic: never renamed
    assert (event.by, event.previous_owner, event.reason, event.found_at, event.fence) == (
        B,
        A,
        "unreadable",
        2,
        1,
    )
    assert agg.is_quarantined and agg.quarantine_reason is QuarantineReason.UNREADABLE
    assert agg.state is ObligationState.ATTEMPTING  # the state is kept; the index shows it
    assert (agg.owner, agg.fence, agg.last_transition_at) == (B, 1, at(2))


def test_a_quarantined_obligation_is_never_sent_claimed_or_retried_only_abandoned(
    track: Any,
) -> None:
    t = track(record())
    agg = t.agg
    agg.quarantine(reason=QuarantineReason.UNDECODABLE, found_at=1, by=B, now=at(1))
    t.new_events()
    with pytest.raises(IllegalTransition, match="quarantined \\(undecodable\\)"):
        agg.start_attempt(by=B, now=at(2))
    with pytest.raises(IllegalTransition, match="quarantined"):
        agg.claim(by=C, now=at(2), policy=POLICY)
    with pytest.raises(IllegalTransition, match="quarantined"):
        agg.request_retry(by=OPERATOR, now=at(2))
    with pytest.raises(IllegalTransition, match="quarantined"):
        agg.quarantine(reason="unreadable", found_at=1, by=C, now=at(2))
    assert t.new_events() == []
    agg.abandon(reason=AbandonReason.OPERATOR, now=at(3), by=OPERATOR, detail="unreadable")
    assert agg.state is ObligationState.ABANDONED


def test_a_paused_owner_reports_late_after_a_quarantine(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.start_attempt(by=A, now=at(1))
    agg.quarantine(reason="unknown_topic", found_at=2, by=B, now=at(2))
    t.new_events()
    agg.confirm_delivery(by=A, now=at(3), fence=0)
    assert names(t.new_events()) == ["LateResultReported"]
    assert agg.state is ObligationState.ATTEMPTING and agg.owner == B


def test_resolved_obligations_are_never_quarantined() -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    agg.confirm_delivery(by=A, now=at(2))
    with pytest.raises(IllegalTransition, match="quarantined"):
        agg.quarantine(reason="unreadable", found_at=1, by=B, now=at(3))
    assert agg.quarantine_reason is None


@pytest.mark.parametrize("found_at", [0, -1, True, 1.0, "1", None])
def test_quarantine_names_a_stored_event_version_of_at_least_one(found_at: object) -> None:
    agg = record()
    with pytest.raises(InvalidInput, match="found_at"):
        agg.quarantine(reason="unreadable", found_at=found_at, by=B, now=at(1))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="unknown quarantine reason"):
        agg.quarantine(reason="broken", found_at=1, by=B, now=at(1))  # type: ignore[arg-type]
    assert agg.version == 1 and not agg.is_quarantined
    agg.quarantine(reason="unreadable", found_at=1, by=B, now=at(1))  # type: ignore[arg-type]
    assert agg.is_quarantined


# -- the same id recorded twice -------------------------------------------------------------


def _as_recorded(agg: DeliveryObligation, **changes: Any) -> SimpleNamespace:
    """The record fields as a stored event carries them (sequences as tuples here)."""
    fields = {name: getattr(agg, name) for name in RECORD_FIELDS}
    fields["parts"] = tuple(fields["parts"])
    fields["media"] = tuple(fields["media"])
    fields.update(changes)
    return SimpleNamespace(**fields)


def test_the_same_record_again_differs_in_nothing_whatever_sequence_it_uses() -> None:
    agg = record("hello world", parts=["hello ", "world"], metadata={"n": 1})
    assert RECORD_FIELDS == ("session_key", "target", "content", "parts", "media", "metadata")
    assert record_differences(agg, _as_recorded(agg)) == ()
    assert record_differences(_as_recorded(agg), agg) == ()


def test_a_conflicting_record_names_every_field_that_differs_in_order() -> None:
    agg = record("hello world", parts=["hello ", "world"], metadata={"n": 1})
    other = DeliveryTarget(platform="telegram", chat_id="2")
    changes: dict[str, Any] = {
        "session_key": "k2",
        "target": other,
        "content": "hello world!",
        "parts": ("hello", " world"),
        "media": (MediaItem(kind="image", uri="file:///a.png"),),
        "metadata": {"n": 2},
    }
    for name, value in changes.items():
        assert record_differences(agg, _as_recorded(agg, **{name: value})) == (name,)
    assert record_differences(agg, _as_recorded(agg, **changes)) == RECORD_FIELDS


@pytest.mark.parametrize(
    "command",
    [
        lambda agg: agg.start_attempt(by=A, now=T0.replace(tzinfo=None)),
        lambda agg: agg.confirm_delivery(by=A, now=T0.replace(tzinfo=None)),
        lambda agg: agg.acknowledge_part(by=A, now=T0.replace(tzinfo=None), index=0),
        lambda agg: agg.fail(by=A, now=T0.replace(tzinfo=None)),
        lambda agg: agg.claim(by=B, now=T0.replace(tzinfo=None), policy=POLICY),
        lambda agg: agg.request_retry(by=B, now=T0.replace(tzinfo=None)),
        lambda agg: agg.abandon(reason="stale", now=T0.replace(tzinfo=None)),
        lambda agg: agg.quarantine(
            reason="unreadable", found_at=1, by=B, now=T0.replace(tzinfo=None)
        ),
    ],
)
def test_every_command_refuses_a_naive_time(command: Any) -> None:
    agg = record()
    agg.start_attempt(by=A, now=at(1))
    agg.collect_events()
    with pytest.raises(InvalidInput, match="timezone-aware"):
        command(agg)
    assert agg.collect_events() == []


# -- the recovery budget: spent by claims whose send started (ADR 0070) ----------------------

D = OwnerIdentity(host="gw-d", boot_id="d", pid=13, start_time=400)
E = OwnerIdentity(host="gw-e", boot_id="e", pid=14, start_time=500)


def test_a_claim_whose_send_never_started_spends_no_recovery_attempt(track: Any) -> None:
    """Gateways killed while a claimed reply waited for its turn (a backlog paced by the
    platform's limits) left it unsent: each next claim takes the last one's place."""
    t = track(record())
    agg = t.agg
    claimers = [B, C, D, E, B, C]  # more claims than the policy's three attempts
    for n, claimer in enumerate(claimers):
        agg.claim(by=claimer, now=at(n + 1), policy=POLICY, records_send=True)
        claimed = t.new_events()[-1]
        assert (claimed.recovery_attempt, claimed.records_send) == (1, True)
        assert agg.claim_unsent and not agg.recovery_spent(POLICY)
    assert agg.recovery_attempts == 1 and agg.fence == len(claimers)


def test_claims_whose_sends_started_reach_max_attempts_as_before(track: Any) -> None:
    """A reply that kills every gateway that sends it is still abandoned after three."""
    t = track(record())
    agg = t.agg
    for n, claimer in enumerate([B, C, D]):
        agg.claim(by=claimer, now=at(2 * n + 1), policy=POLICY, records_send=True)
        assert agg.recovery_attempts == n + 1
        agg.start_recovery_send(by=claimer, now=at(2 * n + 2))
        assert not agg.claim_unsent
    assert names(t.new_events())[-2:] == ["Claimed", "RecoverySendStarted"]
    assert agg.recovery_spent(POLICY)
    with pytest.raises(IllegalTransition, match="3 recovery claims already"):
        agg.claim(by=E, now=at(9), policy=POLICY, records_send=True)
    assert t.new_events() == []


def test_an_unsent_claim_in_between_does_not_count_but_the_others_do(track: Any) -> None:
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY, records_send=True)
    agg.start_recovery_send(by=B, now=at(2))  # B sends, and dies
    agg.claim(by=C, now=at(3), policy=POLICY, records_send=True)  # C dies before its send
    agg.claim(by=D, now=at(4), policy=POLICY, records_send=True)  # takes C's place
    assert agg.recovery_attempts == 2
    agg.start_recovery_send(by=D, now=at(5))
    agg.claim(by=E, now=at(6), policy=POLICY, records_send=True)
    assert [e.recovery_attempt for e in t.new_events() if type(e).__name__ == "Claimed"] == [
        1,
        2,
        2,
        3,
    ]
    assert not agg.recovery_spent(POLICY)  # E's send has not started: E may be replaced
    agg.start_recovery_send(by=E, now=at(7))
    assert agg.recovery_spent(POLICY)


def test_a_claim_without_records_send_spends_its_attempt_at_once(track: Any) -> None:
    """Upstream's callers send straight after ``sweep_recoverable``: their claim is the
    last record before the send, so it counts, as it always did."""
    t = track(record())
    agg = t.agg
    for n, claimer in enumerate([B, C, D]):
        agg.claim(by=claimer, now=at(n + 1), policy=POLICY)
        assert agg.recovery_attempts == n + 1 and not agg.claim_unsent
    assert t.new_events()[-1].records_send is False
    assert agg.recovery_spent(POLICY)


def test_a_recovery_send_starts_once_per_claim_and_only_by_its_claimer(track: Any) -> None:
    t = track(record())
    agg = t.agg
    with pytest.raises(IllegalTransition, match=r"pending.*recovery send started"):
        agg.start_recovery_send(by=A, now=at(1))  # nothing claimed
    agg.claim(by=B, now=at(1), policy=POLICY)
    with pytest.raises(IllegalTransition, match="no claim that records its send"):
        agg.start_recovery_send(by=B, now=at(2))  # a claim that did not promise it
    agg.claim(by=C, now=at(3), policy=POLICY, records_send=True)
    t.new_events()
    with pytest.raises(IllegalTransition, match="owned by"):
        agg.start_recovery_send(by=B, now=at(4))  # fenced out
    agg.start_recovery_send(by=C, now=at(4))
    with pytest.raises(IllegalTransition, match="no claim that records its send"):
        agg.start_recovery_send(by=C, now=at(5))  # once
    assert names(t.new_events()) == ["RecoverySendStarted"]
    with pytest.raises(InvalidInput):
        agg.start_recovery_send(by=C, now=datetime(2026, 1, 1))  # naive time
    assert t.new_events() == []


def test_a_recovery_send_started_says_nothing_new_of_arrivals(track: Any) -> None:
    """The claim already counted as a send for the marker: starting it changes nothing."""
    t = track(record())
    agg = t.agg
    agg.claim(by=B, now=at(1), policy=POLICY, records_send=True)
    before = (agg.marker, agg.needs_marker, agg.state)
    agg.start_recovery_send(by=B, now=at(2))
    assert (agg.marker, agg.needs_marker, agg.state) == before
    agg.confirm_delivery(by=B, now=at(3), receipt=["m-1"])
    assert agg.state is ObligationState.DELIVERED
