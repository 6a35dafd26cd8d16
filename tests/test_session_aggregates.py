"""The session aggregates and the erasure record on their own (no store).

Session, SessionRoute, InboundMessage, SessionKeying and Erasure: what each command
refuses before any event, what each event leaves behind, and that a replay of the events
rebuilds the same state. Their ids key stored aggregates, so they are pinned.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from eventsourcing.utils import get_topic, resolve_topic

from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.sessions.route import (
    KEYING_ID,
    InboundMessage,
    SessionKeying,
    SessionRoute,
    inbound_uuid,
    route_uuid,
)
from gateway_ledger.domain.sessions.session import (
    ROLES,
    MessageAppended,
    Session,
    format_session_id,
    is_session_id,
    session_uuid,
)
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import OwnerIdentity

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SID = "20260101_000000_0123abcd"
NEXT = "20260101_010000_89abcdef"
KEY = "agent:main:telegram:dm:1"
SOURCE = SessionSource(platform="telegram", chat_id="1", user_id="u1")
EIGHT_MIB = 8 * 1024 * 1024


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def public_state(agg: Any) -> dict[str, Any]:
    state = {k: v for k, v in vars(agg).items() if not k.startswith("_")}
    state["version"] = agg.version
    return state


def replay_matches(agg: Any, events: list[Any]) -> bool:
    events = [*events, *agg.collect_events()]
    rebuilt: Any = None
    for e in events:
        rebuilt = e.mutate(rebuilt)
    return public_state(rebuilt) == public_state(agg)


def start(**kwargs: Any) -> Session:
    args: dict[str, Any] = {"session_id": SID, "key": KEY, "source": SOURCE, "now": T0}
    args.update(kwargs)
    return Session.start(**args)


# -- ids -----------------------------------------------------------------------------------


def test_aggregate_ids_are_stable_across_versions() -> None:
    assert session_uuid(SID) == UUID("6bb9385d-5aeb-5738-9b56-4dbeb139754e") == start().id
    assert route_uuid(KEY) == UUID("bcf5a68d-260a-5663-9892-93c458b39fd3")
    assert SessionRoute.open(key=KEY, session_id=SID, now=T0).id == route_uuid(KEY)
    assert inbound_uuid("telegram", "s", "m") == UUID("96b78f5d-0f57-5ba1-889f-a1615bceb3c8")
    assert UUID("407f7dae-4ccc-5bd5-9492-909576fccfca") == KEYING_ID
    assert SessionKeying.establish(mode="raw", now=T0).id == KEYING_ID


def test_inbound_ids_separate_their_three_parts() -> None:
    assert inbound_uuid("a", "b", "cd") != inbound_uuid("a", "bc", "d")
    assert inbound_uuid("ab", "", "c") != inbound_uuid("a", "b", "c")


def test_session_ids_are_upstreams_format() -> None:
    assert format_session_id(datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC), "0a1b2c3d") == (
        "20260304_050607_0a1b2c3d"
    )
    for bad in ("0A1B2C3D", "0a1b2c3", "0a1b2c3d4", "0a1b2c3g", 12345678):
        with pytest.raises(InvalidInput, match="8 lowercase hex"):
            format_session_id(T0, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="timezone-aware"):
        format_session_id(datetime(2026, 1, 1), "0a1b2c3d")
    assert is_session_id(SID)
    for bad in (None, 20260101, "x" + SID, SID + "x", "20260101-000000_0123abcd"):
        assert not is_session_id(bad)


# -- Session -------------------------------------------------------------------------------


def test_a_session_starts_open_and_empty() -> None:
    s = start(previous_session_id=NEXT, reason=ResetReason.IDLE)
    assert (s.session_id, s.key, s.source) == (SID, KEY, SOURCE)
    assert s.created_at == s.last_activity_at == T0
    assert (s.message_count, s.previous_session_id, s.started_reason) == (0, NEXT, "idle")
    assert (s.resume_pending, s.resume_reason, s.resume_marked_at) == (False, None, None)
    assert (s.suspended, s.ended, s.end_reason, s.successor_session_id) == (
        False,
        False,
        None,
        None,
    )
    assert start().started_reason is None and start().previous_session_id is None
    assert replay_matches(s, [])


def test_a_session_start_refuses_bad_input() -> None:
    with pytest.raises(InvalidInput, match="is not YYYYmmdd_HHMMSS"):
        start(session_id="abc")
    with pytest.raises(InvalidInput, match="session key must not be empty"):
        start(key="")
    with pytest.raises(InvalidInput, match="SessionSource"):
        start(source={"platform": "telegram"})
    with pytest.raises(InvalidInput, match="timezone-aware"):
        start(now=datetime(2026, 1, 1))


def test_messages_are_numbered_from_one_and_move_the_activity_clock() -> None:
    s = start()
    assert s.append_message(role="user", content="hi", now=at(1), platform_message_id="p1") == 1
    assert s.append_message(role="assistant", content="", now=at(2)) == 2
    assert (s.message_count, s.last_activity_at, s.created_at) == (2, at(2), T0)
    events = s.collect_events()
    first, second = events[1], events[2]
    assert type(first) is MessageAppended
    assert (first.seq, first.role, first.content, first.platform_message_id) == (
        1,
        "user",
        "hi",
        "p1",
    )
    assert (second.seq, second.platform_message_id, second.timestamp) == (2, None, at(2))
    assert replay_matches(s, events)


def test_every_role_is_accepted_and_nothing_else() -> None:
    assert {"user", "assistant", "system", "tool"} == ROLES
    s = start()
    for i, role in enumerate(sorted(ROLES), start=1):
        assert s.append_message(role=role, content="x", now=at(i)) == i
    with pytest.raises(InvalidInput, match="unknown role 'bot'"):
        s.append_message(role="bot", content="x", now=at(9))


def test_a_message_is_at_most_eight_mib_of_utf8() -> None:
    s = start()
    s.append_message(role="user", content="a" * EIGHT_MIB, now=at(1))
    s.append_message(role="user", content="é" * (EIGHT_MIB // 2), now=at(2))
    s.collect_events()
    for too_big in ("a" * (EIGHT_MIB + 1), "é" * (EIGHT_MIB // 2) + "a"):
        with pytest.raises(InvalidInput, match="larger than"):
            s.append_message(role="user", content=too_big, now=at(3))
    assert s.collect_events() == [] and s.message_count == 2


def test_a_message_refuses_bad_text_ids_and_times() -> None:
    s = start()
    with pytest.raises(InvalidInput, match="content is not valid Unicode"):
        s.append_message(role="user", content="\ud800", now=at(1))
    with pytest.raises(InvalidInput, match="platform_message_id must not be empty"):
        s.append_message(role="user", content="x", now=at(1), platform_message_id="")
    with pytest.raises(InvalidInput, match="timezone-aware"):
        s.append_message(role="user", content="x", now=datetime(2026, 1, 1))
    assert s.message_count == 0 and s.version == 1


def test_a_resume_is_marked_cleared_and_marked_again() -> None:
    s = start()
    s.clear_resume_pending(now=at(1))  # nothing pending: nothing recorded
    assert s.version == 1
    s.mark_resume_pending(now=at(2))
    assert (s.resume_pending, s.resume_reason, s.resume_marked_at) == (True, "restart", at(2))
    s.clear_resume_pending(now=at(3))
    assert (s.resume_pending, s.resume_reason) == (False, None)
    s.mark_resume_pending(now=at(4), reason="shutdown")
    assert (s.resume_reason, s.resume_marked_at, s.version) == ("shutdown", at(4), 4)
    with pytest.raises(InvalidInput, match="reason must not be empty"):
        s.mark_resume_pending(now=at(5), reason="")
    with pytest.raises(InvalidInput, match="timezone-aware"):
        s.clear_resume_pending(now=datetime(2026, 1, 1))
    assert replay_matches(s, [])


def test_every_session_event_keeps_its_stored_name() -> None:
    s = start()
    s.append_message(role="user", content="x", now=at(1))
    s.mark_resume_pending(now=at(2))
    s.clear_resume_pending(now=at(3))
    s.suspend(now=at(4))
    s.reset(reason="idle", successor_session_id=NEXT, now=at(5))
    assert [type(e).__name__ for e in s.collect_events()] == [
        "Started",
        "MessageAppended",
        "ResumeMarked",
        "ResumeCleared",
        "Suspended",
        "Reset",
    ]
    route = SessionRoute.open(key=KEY, session_id=SID, now=T0)
    route.rotate(session_id=NEXT, reason="idle", now=at(1))
    assert [type(e).__name__ for e in route.collect_events()] == ["Opened", "Rotated"]
    seen = InboundMessage.record(
        platform="p", chat_scope="c", platform_message_id="m", session_id=SID, seq=1, now=T0
    )
    assert [type(e).__name__ for e in seen.collect_events()] == ["Seen"]
    keying = SessionKeying.establish(mode="raw", now=T0)
    assert [type(e).__name__ for e in keying.collect_events()] == ["Established"]
    assert [type(e).__name__ for e in erase().collect_events()] == ["SubjectForgotten"]


STORED_FIELDS: dict[type, tuple[str, ...]] = {
    Session.Started: ("session_id", "key", "source", "previous_session_id", "started_reason"),
    Session.MessageAppended: ("seq", "role", "content", "platform_message_id"),
    Session.ResumeMarked: ("reason",),
    Session.ResumeCleared: (),
    Session.Suspended: (),
    Session.Reset: ("reason", "successor_session_id"),
    Session.Reopened: ("reason",),
    SessionRoute.Opened: ("key", "session_id"),
    SessionRoute.Rotated: ("previous_session_id", "session_id", "reason"),
    InboundMessage.Seen: ("platform", "chat_scope", "platform_message_id", "session_id", "seq"),
    SessionKeying.Established: ("mode",),
    Erasure.SubjectForgotten: (
        "subject_id",
        "by",
        "requested_by",
        "destroyed_keys",
        "abandoned",
        "sessions",
    ),
}
"""What each event stores besides the library's own fields, in order: never changed."""


STORED_MODULES = {
    Session: "gateway_ledger.domain.session",
    SessionRoute: "gateway_ledger.domain.session_route",
    InboundMessage: "gateway_ledger.domain.session_route",
    SessionKeying: "gateway_ledger.domain.session_route",
    Erasure: "gateway_ledger.domain.erasure",
}
"""The modules these aggregates were first stored under: every stored event names its class
by ``<module>:<qualname>``, so they never change wherever the code lives."""


def test_every_event_is_written_and_read_under_its_first_topic() -> None:
    for aggregate, module in STORED_MODULES.items():
        for cls in (
            aggregate,
            *(c for c in STORED_FIELDS if c.__qualname__.startswith(aggregate.__qualname__ + ".")),
        ):
            topic = f"{module}:{cls.__qualname__}"
            assert get_topic(cls) == topic and resolve_topic(topic) is cls
    assert get_topic(Session.MessageAppended) == (
        "gateway_ledger.domain.session:Session.MessageAppended"
    )


def test_every_event_class_declares_exactly_its_stored_fields() -> None:
    library = ("originator_id", "originator_version", "timestamp", "originator_topic")
    for cls, fields in STORED_FIELDS.items():
        names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in library)
        assert names == fields, cls.__qualname__
    assert MessageAppended is Session.MessageAppended


@pytest.mark.parametrize(
    "command",
    [
        lambda s: s.mark_resume_pending(now=datetime(2026, 1, 1)),
        lambda s: s.suspend(now=datetime(2026, 1, 1)),
        lambda s: s.reset(reason="idle", successor_session_id=NEXT, now=datetime(2026, 1, 1)),
    ],
)
def test_every_session_command_refuses_a_naive_time(command: Any) -> None:
    s = start()
    s.collect_events()
    with pytest.raises(InvalidInput, match="now must be timezone-aware"):
        command(s)
    assert s.collect_events() == []


def test_suspending_is_recorded_once() -> None:
    s = start()
    s.suspend(now=at(1))
    s.suspend(now=at(2))
    assert s.suspended is True and s.version == 2
    assert replay_matches(s, [])


def test_a_reset_ends_the_session_and_names_its_successor() -> None:
    s = start()
    s.mark_resume_pending(now=at(1))
    s.reset(reason=ResetReason.DAILY, successor_session_id=NEXT, now=at(2))
    assert (s.ended, s.end_reason, s.successor_session_id) == (True, "daily", NEXT)
    assert s.resume_pending is False
    assert replay_matches(s, [])


def test_a_reset_needs_another_valid_session() -> None:
    s = start()
    for bad in (SID, "next"):
        with pytest.raises(InvalidInput, match="another valid session id"):
            s.reset(reason=ResetReason.IDLE, successor_session_id=bad, now=at(1))
    with pytest.raises(ValueError):
        s.reset(reason="bored", successor_session_id=NEXT, now=at(1))  # type: ignore[arg-type]
    assert s.ended is False and s.version == 1


def test_an_ended_session_refuses_everything_that_would_change_it() -> None:
    s = start()
    s.reset(reason="session_reset", successor_session_id=NEXT, now=at(1))
    s.collect_events()
    commands = [
        lambda: s.append_message(role="user", content="x", now=at(2)),
        lambda: s.mark_resume_pending(now=at(2)),
        lambda: s.suspend(now=at(2)),
        lambda: s.reset(reason="idle", successor_session_id="20260101_020000_00000000", now=at(2)),
    ]
    for command, transition in zip(
        commands, ("append", "resume marked", "suspended", r"reset \(idle\)"), strict=True
    ):
        refused = rf"Session {SID} is ended \(session_reset\); refused {transition}: "
        with pytest.raises(IllegalTransition, match=refused + f"continued in {NEXT}$"):
            command()
    assert s.collect_events() == [] and s.message_count == 0


# -- routes, inbound messages, keying --------------------------------------------------------


def test_a_route_opens_at_a_session_and_rotates_to_new_ones() -> None:
    route = SessionRoute.open(key=KEY, session_id=SID, now=T0)
    assert (route.key, route.session_id, route.opened_at, route.rotations) == (KEY, SID, T0, 0)
    route.rotate(session_id=NEXT, reason=ResetReason.IDLE, now=at(1))
    route.rotate(session_id=SID, reason="session_switch", now=at(2))
    assert (route.session_id, route.rotations, route.opened_at) == (SID, 2, T0)
    events = route.collect_events()
    assert (events[1].previous_session_id, events[1].session_id, events[1].reason) == (
        SID,
        NEXT,
        "idle",
    )
    assert replay_matches(route, events)
    refused = rf"^SessionRoute {KEY} is at {SID}; refused rotated: same session$"
    with pytest.raises(IllegalTransition, match=refused):
        route.rotate(session_id=SID, reason="idle", now=at(3))
    with pytest.raises(InvalidInput, match="is not YYYYmmdd"):
        route.rotate(session_id="x", reason="idle", now=at(3))
    with pytest.raises(InvalidInput, match="timezone-aware"):
        route.rotate(session_id=NEXT, reason="idle", now=datetime(2026, 1, 1))
    assert route.version == 3


def test_a_route_refuses_a_bad_key_session_or_time() -> None:
    with pytest.raises(InvalidInput, match="session key must not be empty"):
        SessionRoute.open(key="", session_id=SID, now=T0)
    with pytest.raises(InvalidInput, match="is not YYYYmmdd"):
        SessionRoute.open(key=KEY, session_id="s", now=T0)
    with pytest.raises(InvalidInput, match="timezone-aware"):
        SessionRoute.open(key=KEY, session_id=SID, now=datetime(2026, 1, 1))


def test_an_inbound_message_is_keyed_by_platform_scope_and_id() -> None:
    seen = InboundMessage.record(
        platform="telegram", chat_scope="c", platform_message_id="m", session_id=SID, seq=3, now=T0
    )
    assert (
        seen.id
        == inbound_uuid("telegram", "c", "m")
        == InboundMessage.create_id("telegram", "c", "m")
    )
    assert (seen.platform, seen.platform_message_id, seen.session_id, seen.seq) == (
        "telegram",
        "m",
        SID,
        3,
    )
    assert replay_matches(seen, [])
    for bad in ({"platform": ""}, {"platform_message_id": ""}, {"now": datetime(2026, 1, 1)}):
        args: dict[str, Any] = {
            "platform": "telegram",
            "chat_scope": "c",
            "platform_message_id": "m",
            "session_id": SID,
            "seq": 1,
            "now": T0,
        }
        args.update(bad)
        with pytest.raises(InvalidInput):
            InboundMessage.record(**args)


def test_the_keying_mode_is_recorded_once_as_given() -> None:
    keying = SessionKeying.establish(mode="keyed:abc", now=T0)
    assert keying.mode == "keyed:abc" and SessionKeying.create_id() == KEYING_ID
    assert replay_matches(keying, [])
    with pytest.raises(InvalidInput, match="keying mode must not be empty"):
        SessionKeying.establish(mode="", now=T0)
    with pytest.raises(InvalidInput, match="timezone-aware"):
        SessionKeying.establish(mode="raw", now=datetime(2026, 1, 1))


# -- erasure -------------------------------------------------------------------------------


OPERATOR = OwnerIdentity(host="ops", boot_id="b", pid=1)


def erase(**kwargs: Any) -> Erasure:
    args: dict[str, Any] = {
        "erasure_id": UUID(int=7),
        "subject_id": "subj",
        "by": OPERATOR,
        "requested_by": "",
        "destroyed_keys": ("k1", "k2"),
        "abandoned": ["o1"],
        "now": T0,
    }
    args.update(kwargs)
    return Erasure.record(**args)


def test_an_erasure_records_who_what_and_when() -> None:
    e = erase(requested_by="dpo", sessions=[SID])
    assert e.id == UUID(int=7)
    assert (e.subject_id, e.by, e.requested_by, e.erased_at) == ("subj", OPERATOR, "dpo", T0)
    assert (e.destroyed_keys, e.abandoned, e.sessions) == (["k1", "k2"], ["o1"], [SID])
    assert erase().sessions == [] and erase().requested_by == ""
    assert replay_matches(e, [])


def test_an_erasure_recorded_before_sessions_were_listed_replays_with_none() -> None:
    e = erase()
    (event,) = e.collect_events()
    older = type(event)(**{**event.__dict__, "sessions": None})
    rebuilt = older.mutate(None)
    assert rebuilt.sessions == [] and rebuilt.subject_id == "subj"


@pytest.mark.parametrize(
    "bad",
    [
        {"subject_id": ""},
        {"by": "ops"},
        {"requested_by": None},
        {"now": datetime(2026, 1, 1)},
        {"erasure_id": str(uuid4())},
        {"destroyed_keys": [""]},
        {"abandoned": [5]},
        {"sessions": [""]},
    ],
)
def test_an_erasure_refuses_bad_input(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        erase(**bad)
