"""SessionSource, upstream hashing, session keys and path guards (pure domain)."""

from __future__ import annotations

import hashlib
import hmac

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.privacy.hashing import (
    KeyedHasher,
    hash_chat_id,
    hash_id,
    hash_sender_id,
    keyed_hash_chat_id,
    keyed_hash_id,
    keyed_hash_sender_id,
)
from gateway_ledger.domain.sessions.key import (
    build_session_key,
    is_path_unsafe,
    is_session_key_unsafe,
)
from gateway_ledger.domain.sessions.session import format_session_id, is_session_id
from gateway_ledger.domain.sessions.source import PERSONAL_FIELDS, SessionSource

SECRET = bytes(range(32))

# -- the reference's key examples ------------------------------------------------------------


def test_reference_key_examples_are_byte_identical() -> None:
    dm = SessionSource(platform="telegram", chat_id="99", chat_type="dm", user_id="7")
    group = SessionSource(
        platform="discord", chat_id="guild-123", chat_type="group", user_id="alice"
    )
    topic = SessionSource(
        platform="telegram",
        chat_id="-1002285219667",
        chat_type="group",
        thread_id="17585",
        user_id="555",
    )
    assert build_session_key(dm) == "agent:main:telegram:dm:99"
    assert build_session_key(group) == "agent:main:discord:group:guild-123:alice"
    assert build_session_key(topic) == "agent:main:telegram:group:-1002285219667:17585"


def test_dm_fallbacks_follow_upstream() -> None:
    def key(**kw: object) -> str:
        return build_session_key(SessionSource(platform="signal", chat_type="dm", **kw))  # type: ignore[arg-type]

    assert key(chat_id="c", thread_id="t") == "agent:main:signal:dm:c:t"
    assert key(user_id="u", thread_id="t") == "agent:main:signal:dm:u:t"
    assert key(user_id="u", user_id_alt="uuid-1") == "agent:main:signal:dm:uuid-1"
    assert key(thread_id="t") == "agent:main:signal:dm:t"
    assert key() == "agent:main:signal:dm"


def test_group_isolation_rules_and_profiles() -> None:
    src = SessionSource(
        platform="slack", chat_id="C1", chat_type="thread", thread_id="T", user_id="U"
    )
    assert build_session_key(src) == "agent:main:slack:thread:C1:T"
    assert build_session_key(src, thread_sessions_per_user=True) == "agent:main:slack:thread:C1:T:U"
    group = SessionSource(platform="slack", chat_id="C1", chat_type="group", user_id="U")
    assert build_session_key(group, group_sessions_per_user=False) == "agent:main:slack:group:C1"
    assert build_session_key(group, profile="ops") == "agent:ops:slack:group:C1:U"
    assert build_session_key(group, profile="default") == "agent:main:slack:group:C1:U"
    assert build_session_key(group, profile="main") == "agent:main~:slack:group:C1:U"
    assert build_session_key(
        SessionSource(platform="slack", chat_id="C1", chat_type="group", user_id="U", profile="ops")
    ).startswith("agent:ops:")


def test_escaping_removes_the_upstream_collision() -> None:
    a = SessionSource(platform="x", chat_id="a:b", chat_type="thread", thread_id="c")
    b = SessionSource(platform="x", chat_id="a", chat_type="thread", thread_id="b:c")
    assert build_session_key(a) == "agent:main:x:thread:a%3Ab:c"
    assert build_session_key(b) == "agent:main:x:thread:a:b%3Ac"
    pct = SessionSource(platform="x", chat_id="a%3Ab", chat_type="thread", thread_id="c")
    assert build_session_key(pct) == "agent:main:x:thread:a%253Ab:c"


def test_google_chat_key_is_legal_but_not_a_path() -> None:
    src = SessionSource(
        platform="google_chat",
        chat_id="spaces/AAA",
        chat_type="group",
        thread_id="spaces/AAA/threads/BBB",
    )
    key = build_session_key(src)
    assert key == "agent:main:google_chat:group:spaces/AAA:spaces/AAA/threads/BBB"
    assert not is_session_key_unsafe(key)
    assert is_path_unsafe(key)


def test_traversing_id_is_refused_when_the_key_is_built() -> None:
    src = SessionSource(platform="telegram", chat_id="../../etc", chat_type="dm")
    with pytest.raises(InvalidInput, match="traversal"):
        build_session_key(src)
    hashed = build_session_key(src, hasher=KeyedHasher(SECRET))  # no raw id left to traverse
    assert ".." not in hashed


def test_a_key_is_built_only_from_a_session_source() -> None:
    for not_a_source in ({"platform": "telegram", "chat_id": "1"}, "telegram:1", None):
        with pytest.raises(InvalidInput, match="source must be a SessionSource"):
            build_session_key(not_a_source)  # type: ignore[arg-type]


def test_hashed_key_holds_no_raw_id_and_tags_each_slot() -> None:
    hasher = KeyedHasher(SECRET)
    src = SessionSource(platform="telegram", chat_id="-100555", chat_type="group", user_id="4242")
    key = build_session_key(src, hasher=hasher)
    assert "-100555" not in key and "4242" not in key
    assert key == (
        f"agent:main:telegram:group:{keyed_hash_id(SECRET, '-100555')}:"
        f"user_{keyed_hash_id(SECRET, '4242')}"
    )
    topic = SessionSource(
        platform="telegram", chat_id="-100555", chat_type="group", thread_id="4242"
    )
    assert build_session_key(topic, hasher=hasher).endswith(f":t{keyed_hash_id(SECRET, '4242')}")


# -- guards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path_unsafe", "key_unsafe"),
    [
        ("", False, False),
        (None, False, False),
        ("20260720_101500_abcdef12", False, False),
        ("..", True, True),
        ("a..b", True, True),
        ("a/b", True, False),
        ("/etc/passwd", True, True),
        ("a\\b", True, False),
        ("\\\\server\\share", True, True),
        ("C:", True, True),
        ("d:/x", True, True),
        ("C:\\Windows", True, True),
        ("agent:main:google_chat:group:spaces/AAA/threads/BBB", True, False),
        ("spaces/AAA/threads/BBB", True, False),
        ("1:", False, False),
    ],
)
def test_reference_guard_cases(value: object, path_unsafe: bool, key_unsafe: bool) -> None:
    assert is_path_unsafe(value) is path_unsafe
    assert is_session_key_unsafe(value) is key_unsafe


@given(st.text())
def test_key_guard_is_never_stricter_than_path_guard(value: str) -> None:
    if is_session_key_unsafe(value):
        assert is_path_unsafe(value)
    if ".." in value:
        assert is_path_unsafe(value) and is_session_key_unsafe(value)


@given(st.text(alphabet="ab/", min_size=1).filter(lambda s: not s.startswith("/")))
def test_interior_slashes_are_legal_in_keys(value: str) -> None:
    assert not is_session_key_unsafe(value)
    assert is_path_unsafe(value) == ("/" in value)


# -- hashing -----------------------------------------------------------------------------------


def test_hash_values_are_the_upstream_formula() -> None:
    expected = hashlib.sha256(b"12345").hexdigest()[:12]
    assert hash_id("12345") == expected == "5994471abb01"
    assert hash_sender_id("12345") == f"user_{expected}"
    assert hash_chat_id("telegram:12345") == f"telegram:{expected}"
    assert hash_chat_id("12345") == expected
    assert hash_chat_id(":12345") == hashlib.sha256(b":12345").hexdigest()[:12]
    assert hash_id("+15551234567") == hashlib.sha256(b"+15551234567").hexdigest()[:12]


def test_keyed_hash_is_hmac_sha256() -> None:
    mac = hmac.new(SECRET, b"12345", hashlib.sha256).hexdigest()
    assert keyed_hash_id(SECRET, "12345") == mac[:24]
    assert keyed_hash_sender_id(SECRET, "12345") == f"user_{mac[:24]}"
    assert keyed_hash_chat_id(SECRET, "telegram:12345") == f"telegram:{mac[:24]}"
    assert KeyedHasher(SECRET)("12345") == mac[:24]
    assert "secret" not in repr(KeyedHasher(SECRET)).lower().replace("keyedhasher", "")
    with pytest.raises(InvalidInput):
        KeyedHasher(b"short")


@given(st.text(), st.binary(min_size=16, max_size=64))
def test_keyed_hash_is_stable_and_distinct_from_unkeyed(value: str, secret: bytes) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return
    first = keyed_hash_id(secret, value)
    assert first == keyed_hash_id(bytes(secret), value)
    assert first[:12] != hash_id(value)
    assert keyed_hash_id(secret + b"x", value) != first


# -- injectivity -------------------------------------------------------------------------------

ids = st.text(alphabet="ab:%/1", min_size=1, max_size=6)


@st.composite
def sources(draw: st.DrawFn) -> SessionSource:
    chat_type = draw(st.sampled_from(["dm", "group", "channel", "thread"]))
    return SessionSource(
        platform=draw(st.sampled_from(["telegram", "x:y", "a%"])),
        chat_id=draw(ids),
        chat_type=chat_type,
        thread_id=draw(st.none() | ids),
        user_id=draw(ids),
    )


def identity(src: SessionSource) -> tuple[object, ...]:
    """What makes a conversation, under the default isolation rules."""
    if src.chat_type == "dm":
        return (src.platform, "dm", src.chat_id, src.thread_id)
    user = None if src.thread_id else src.user_id
    return (src.platform, src.chat_type, src.chat_id, src.thread_id, user)


@given(sources(), sources())
def test_raw_keys_are_injective_over_sources(a: SessionSource, b: SessionSource) -> None:
    """Sources with every id present and ':'/'%' in them: equal keys iff same conversation."""
    ka, kb = build_session_key(a), build_session_key(b)
    assert (ka == kb) == (identity(a) == identity(b))


@st.composite
def sparse_sources(draw: st.DrawFn) -> SessionSource:
    return SessionSource(
        platform="telegram",
        chat_id=draw(st.sampled_from(["", "a", "a:b", "1%"])),
        chat_type=draw(st.sampled_from(["dm", "group"])),
        thread_id=draw(st.sampled_from([None, "a", "b:c", "1%"])),
        user_id=draw(st.sampled_from([None, "a", "b:c", "1%"])),
    )


def sparse_identity(src: SessionSource) -> tuple[object, ...]:
    if src.chat_type == "dm":
        return ("dm", src.chat_id, None if src.chat_id else src.user_id, src.thread_id)
    return ("group", src.chat_id, src.thread_id, None if src.thread_id else src.user_id)


@given(sparse_sources(), sparse_sources())
def test_hashed_keys_are_injective_even_with_missing_slots(
    a: SessionSource, b: SessionSource
) -> None:
    hasher = KeyedHasher(SECRET)
    ka, kb = build_session_key(a, hasher=hasher), build_session_key(b, hasher=hasher)
    assert (ka == kb) == (sparse_identity(a) == sparse_identity(b))


# -- SessionSource -----------------------------------------------------------------------------


def test_source_validation_and_normalisation() -> None:
    src = SessionSource(platform="telegram", chat_id=12345, user_id=7, thread_id="")
    assert src.chat_id == "12345" and src.user_id == "7" and src.thread_id is None
    # any non-empty type is accepted (adapters send forum, webhook, ...); empty is not
    assert SessionSource(platform="telegram", chat_id="1", chat_type="supergroup").chat_type
    for bad in ("", " group", "a\x00b"):
        with pytest.raises(InvalidInput, match="chat_type"):
            SessionSource(platform="telegram", chat_id="1", chat_type=bad)
    with pytest.raises(InvalidInput, match="platform"):
        SessionSource(platform="", chat_id="1")
    with pytest.raises(InvalidInput):
        SessionSource(platform="telegram", chat_id="\ud800")


def test_optional_source_fields_are_any_valid_text() -> None:
    src = SessionSource(platform="telegram", user_name=" ", chat_topic="é", is_bot=False)
    assert (src.user_name, src.chat_topic, src.is_bot) == (" ", "é", False)
    assert SessionSource(platform="telegram").is_bot is False
    for name in ("user_name", "thread_id", "profile", "message_id"):
        with pytest.raises(InvalidInput, match=f"{name} is not valid Unicode"):
            SessionSource(platform="telegram", **{name: "\ud800"})
        with pytest.raises(InvalidInput, match=f"{name} must be a str, not float"):
            SessionSource(platform="telegram", **{name: 1.5})
    for padded in (" telegram", "telegram\n"):
        with pytest.raises(InvalidInput, match="surrounding whitespace"):
            SessionSource(platform=padded)


def test_the_profile_is_kept_in_clear_so_it_refuses_nul_and_more_than_256_characters() -> None:
    # Any other optional field is sealed at rest and may hold NUL; the profile names no
    # person and is kept in clear (an index, operators' output), like a platform name.
    assert SessionSource(platform="telegram", user_name="a\x00b").user_name == "a\x00b"
    assert SessionSource(platform="telegram", profile=" ").profile == " "  # any text, as above
    assert SessionSource(platform="telegram", profile="p" * 256).profile == "p" * 256
    with pytest.raises(InvalidInput, match="profile must not contain NUL"):
        SessionSource(platform="telegram", profile="ops\x00")
    with pytest.raises(InvalidInput, match="profile is longer than 256"):
        SessionSource(platform="telegram", profile="p" * 257)


def test_a_missing_chat_id_is_empty_text() -> None:
    assert SessionSource(platform="telegram").chat_id == ""
    assert SessionSource(platform="telegram", chat_id=None).chat_id == ""  # type: ignore[arg-type]


def test_every_id_and_name_of_a_source_is_personal() -> None:
    """What is sealed at rest: all of a source's text fields but the platform, the chat
    type and the profile, which name no person and no chat."""
    text_fields = {f.name for f in attrs.fields(SessionSource) if f.type in ("str", "str | None")}
    assert set(PERSONAL_FIELDS) == text_fields - {"platform", "chat_type", "profile"}
    assert len(PERSONAL_FIELDS) == len(set(PERSONAL_FIELDS)) == 11


def test_source_round_trip_never_carries_trust_flags() -> None:
    src = SessionSource(
        platform="discord",
        chat_id="c",
        chat_name="Ops",
        chat_type="group",
        user_id="u",
        user_name="alice",
        thread_id="42",
        chat_topic="incidents",
        user_id_alt="alt",
        chat_id_alt="calt",
        is_bot=True,
        scope_id="guild",
        parent_chat_id="parent",
        message_id="m",
        profile="ops",
        delivered_via_upstream_relay=True,
        role_authorized=True,
    )
    data = src.to_dict()
    assert "delivered_via_upstream_relay" not in data and "role_authorized" not in data
    back = SessionSource.from_dict(
        {**data, "role_authorized": True, "delivered_via_upstream_relay": True}
    )
    assert back == src
    assert back.role_authorized is False and back.delivered_via_upstream_relay is False
    assert (
        SessionSource.from_dict({"platform": "discord", "chat_id": "c", "guild_id": "g"}).scope_id
        == "g"
    )


def test_description_is_readable() -> None:
    assert (
        SessionSource(platform="telegram", chat_id="1", user_name="alice").description
        == "DM with alice"
    )
    ops = SessionSource(
        platform="slack", chat_id="C", chat_name="Ops", chat_type="group", thread_id="42"
    )
    assert ops.description == "group: Ops, thread: 42"
    assert (
        SessionSource(platform="slack", chat_id="C", chat_type="channel").description
        == "channel: C"
    )
    assert SessionSource(platform="local", chat_id="-").description == "CLI terminal"
    assert SessionSource(platform="telegram", chat_id="1").description == "DM with user"
    assert SessionSource(platform="telegram", chat_id="1", user_id="7").description == "DM with 7"
    thread = SessionSource(platform="slack", chat_id="C", chat_name="Ops", chat_type="thread")
    assert thread.description == "Ops"  # a thread's chat has no kind prefix


def test_a_stored_source_needs_only_its_platform() -> None:
    src = SessionSource.from_dict({"platform": "telegram"})
    assert (src.chat_id, src.chat_type, src.is_bot, src.scope_id) == ("", "dm", False, None)
    with pytest.raises(InvalidInput, match="needs a platform"):
        SessionSource.from_dict({"chat_id": "1"})
    with pytest.raises(InvalidInput, match="must be a mapping"):
        SessionSource.from_dict([("platform", "telegram")])  # type: ignore[arg-type]


def test_upstreams_guild_id_fills_the_scope_only_when_none_is_stored() -> None:
    old = SessionSource.from_dict({"platform": "discord", "guild_id": "g1"})
    assert old.scope_id == "g1"
    both = SessionSource.from_dict({"platform": "discord", "guild_id": "g1", "scope_id": "s1"})
    assert both.scope_id == "s1"


def test_only_a_dm_is_a_dm() -> None:
    assert SessionSource(platform="telegram", chat_id="1").is_dm
    for kind in ("group", "channel", "thread"):
        assert not SessionSource(platform="telegram", chat_id="1", chat_type=kind).is_dm


def test_flags_are_bools() -> None:
    for flag in ("is_bot", "delivered_via_upstream_relay", "role_authorized"):
        with pytest.raises(InvalidInput, match=f"{flag} must be a bool"):
            SessionSource(platform="telegram", **{flag: "yes"})


def test_session_id_format() -> None:
    from datetime import UTC, datetime

    sid = format_session_id(datetime(2026, 7, 20, 10, 15, 0, tzinfo=UTC), "abcdef12")
    assert sid == "20260720_101500_abcdef12" and is_session_id(sid) and not is_path_unsafe(sid)
    with pytest.raises(InvalidInput):
        format_session_id(datetime(2026, 7, 20, tzinfo=UTC), "XYZ")
