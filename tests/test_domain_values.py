"""The domain's value objects and validators, and the identifier hashing, at their edges.

Stored spellings (states, error classes, guards, abandon reasons) are read back by every
later version and by the views, so they are pinned here; so are the limits the README
promises and the hash formulas, which key stored data.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from datetime import UTC, datetime, timedelta, tzinfo

import pytest

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
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.values import (
    MAX_METADATA_BYTES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    QUARANTINED,
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    MediaItem,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
    SendGuard,
    cut_error,
    receipt_ids,
    require_aware,
    require_choice,
    require_clear_text,
    require_content,
    require_json_like,
    require_metadata,
    require_text,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECRET = bytes(range(16))


# -- stored spellings ------------------------------------------------------------------------


def test_stored_enum_spellings_never_change() -> None:
    assert [s.value for s in ObligationState] == [
        "pending",
        "attempting",
        "delivered",
        "failed",
        "claimed",
        "abandoned",
    ]
    assert [e.value for e in ErrorClass] == ["rejected", "rate_limited", "ambiguous", "dead_target"]
    assert [g.value for g in SendGuard] == ["none", "marker", "idempotency_key"]
    assert [r.value for r in AbandonReason] == [
        "max_attempts",
        "stale",
        "dead_target",
        "operator",
        "erased",
    ]
    assert [q.value for q in QuarantineReason] == ["unknown_topic", "undecodable", "unreadable"]
    assert QUARANTINED == "quarantined"  # the obligation index's state for a quarantined one


def test_only_delivered_and_abandoned_are_final() -> None:
    assert {s for s in ObligationState if s.is_final} == {
        ObligationState.DELIVERED,
        ObligationState.ABANDONED,
    }


def test_only_an_ambiguous_failure_may_have_arrived() -> None:
    assert [e for e in ErrorClass if e.may_have_arrived] == [ErrorClass.AMBIGUOUS]


# -- text ----------------------------------------------------------------------------------


def test_text_must_be_a_non_blank_str_unless_empty_is_allowed() -> None:
    for blank in ("", " ", "\t\n"):
        with pytest.raises(InvalidInput, match="name must not be empty"):
            require_text("name", blank)
        assert require_text("name", blank, allow_empty=True) == blank
    with pytest.raises(InvalidInput, match="name must be a str, not int"):
        require_text("name", 5)
    with pytest.raises(InvalidInput, match="must be a str"):
        require_text("name", b"x", allow_empty=True)
    assert require_text("name", " x ") == " x "


def test_text_must_encode_as_utf8_and_comes_back_unchanged() -> None:
    for good in ("ascii", "é", "🙂", "nul\x00"):
        assert require_text("name", good) == good
    for bad in ("\ud800", "ok\udfffok"):
        with pytest.raises(InvalidInput, match="name is not valid Unicode text"):
            require_text("name", bad)


def test_diagnostic_text_is_cut_to_500_characters_and_never_refused() -> None:
    assert cut_error("x" * 500) == "x" * 500
    assert cut_error("x" * 501) == "x" * 500
    assert cut_error("a\ud800b") == "a?b"
    assert cut_error("é" * 600) == "é" * 500  # characters, not bytes


# -- times ---------------------------------------------------------------------------------


class _NoOffset(tzinfo):
    """A tzinfo that does not know its offset: as unusable as none at all."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None


def test_times_must_be_aware_datetimes() -> None:
    assert require_aware("when", T0) is T0
    with pytest.raises(InvalidInput, match="when must be timezone-aware"):
        require_aware("when", datetime(2026, 1, 1))
    with pytest.raises(InvalidInput, match="when must be timezone-aware"):
        require_aware("when", datetime(2026, 1, 1, tzinfo=_NoOffset()))
    with pytest.raises(InvalidInput, match="when must be a datetime, not str"):
        require_aware("when", "2026-01-01T00:00:00Z")


# -- JSON-like metadata --------------------------------------------------------------------


def _nested(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_metadata_nests_33_levels_deep_and_no_deeper() -> None:
    require_json_like("m", _nested(33))
    require_json_like("m", {"a": _nested(32)})
    with pytest.raises(InvalidInput, match=r"m.* is nested too deeply"):
        require_json_like("m", _nested(34))
    with pytest.raises(InvalidInput, match="nested too deeply"):
        require_json_like("m", {"a": _nested(33)})


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, 1.5, -0.0, "", "text", -(2**63), 2**64 - 1, [], {}, {"": [1, "x"]}],
)
def test_plain_json_values_are_accepted(value: object) -> None:
    require_json_like("m", value)
    require_json_like("m", {"k": value})
    require_json_like("m", [value])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (math.nan, "JSON cannot carry"),
        (math.inf, "JSON cannot carry"),
        (-math.inf, "JSON cannot carry"),
        (-(2**63) - 1, "64-bit"),
        (2**64, "64-bit"),
        ("\ud800", "not valid Unicode"),
        ((1, 2), "holds a tuple"),
        ({1, 2}, "holds a set"),
        (b"x", "holds a bytes"),
        (T0, "holds a datetime"),
    ],
)
def test_values_json_cannot_carry_are_refused_at_any_depth(value: object, message: str) -> None:
    for wrapped in (value, {"k": value}, [value], {"k": [{"j": value}]}):
        with pytest.raises(InvalidInput, match=message):
            require_json_like("m", wrapped)


def test_metadata_keys_are_text_and_the_typed_value_keys_are_reserved() -> None:
    with pytest.raises(InvalidInput, match="keys must be str, not int"):
        require_json_like("m", {1: "x"})
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        require_json_like("m", {"\udc80": "x"})
    with pytest.raises(InvalidInput, match="reserved for typed values"):
        require_json_like("m", {"_type_": "datetime_iso", "_data_": "2026"})
    with pytest.raises(InvalidInput, match="reserved"):
        require_json_like("m", {"k": {"_type_": "x", "_data_": "y"}})
    require_json_like("m", {"_type_": "x"})
    require_json_like("m", {"_type_": "x", "_data_": "y", "more": 1})


# -- choices, clear text, metadata size -------------------------------------------------------


def test_a_choice_is_a_member_or_its_spelling_and_anything_else_names_the_accepted() -> None:
    assert require_choice("abandon reason", "stale", AbandonReason) is AbandonReason.STALE
    assert require_choice("abandon reason", AbandonReason.ERASED, AbandonReason) is (
        AbandonReason.ERASED
    )
    accepted = "one of: max_attempts, stale, dead_target, operator, erased"
    for bad in ("STALE", "", 1, None, ResetReason.IDLE):
        with pytest.raises(InvalidInput, match=f"unknown abandon reason .*\\({accepted}\\)"):
            require_choice("abandon reason", bad, AbandonReason)


def test_clear_text_refuses_nul_blanks_and_more_than_256_characters() -> None:
    assert MAX_NAME_CHARS == 256 and MAX_REASON_CHARS == 500  # promised in the README
    name = "n" * MAX_NAME_CHARS
    assert require_clear_text("host", name) == name
    assert require_clear_text("host", "é" * MAX_NAME_CHARS) == "é" * MAX_NAME_CHARS  # characters
    with pytest.raises(InvalidInput, match="host is longer than 256 characters"):
        require_clear_text("host", name + "n")
    assert require_clear_text("reason", "r" * 500, max_chars=500) == "r" * 500
    with pytest.raises(InvalidInput, match="longer than 500"):
        require_clear_text("reason", "r" * 501, max_chars=500)
    for nul in ("\x00", "a\x00b"):
        with pytest.raises(InvalidInput, match="must not contain NUL"):
            require_clear_text("host", nul)
    with pytest.raises(InvalidInput, match="host must not be empty"):
        require_clear_text("host", "")
    assert require_clear_text("requested_by", "", allow_empty=True) == ""
    with pytest.raises(InvalidInput, match="host must be a str"):
        require_clear_text("host", 7)
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        require_clear_text("host", "\ud800")


def test_names_kept_in_clear_on_owners_and_targets_refuse_nul_and_blanks() -> None:
    with pytest.raises(InvalidInput, match="host must not contain NUL"):
        OwnerIdentity(host="h\x00", boot_id="b", pid=1)
    with pytest.raises(InvalidInput, match="boot_id is longer than 256"):
        OwnerIdentity(host="h", boot_id="b" * 257, pid=1)
    with pytest.raises(InvalidInput, match="platform must not be empty"):
        DeliveryTarget(platform="", chat_id="c")
    with pytest.raises(InvalidInput, match="platform must not contain NUL"):
        DeliveryTarget(platform="t\x00", chat_id="c")


def test_metadata_is_a_mapping_copied_into_a_dict_and_none_is_empty() -> None:
    given = {"parse_mode": "HTML", "buttons": [["a", 1]]}
    meta = require_metadata("metadata", given)
    assert meta == given and type(meta) is dict and meta is not given
    assert require_metadata("metadata", None) == {}
    assert require_metadata("metadata", {}) == {}
    for bad in ([("a", 1)], "x", 0):
        with pytest.raises(InvalidInput, match="metadata must be a mapping"):
            require_metadata("metadata", bad)
    with pytest.raises(InvalidInput, match="JSON cannot carry"):
        require_metadata("metadata", {"a": {1, 2}})


def _at_weight(shape: str, weight: int) -> dict[str, object]:
    """Metadata of exactly ``weight`` by the documented count: strings and keys in UTF-8
    bytes, 8 bytes for every other value (a mapping and a list too)."""
    if shape == "ascii":  # 8 (the mapping) + 1 (the key) + the string
        return {"k": "x" * (weight - 9)}
    if shape == "utf8":  # 'é' is two bytes
        return {"k": "é" * 1000 + "x" * (weight - 9 - 2000)}
    if shape == "list":  # 8 + 1 + (8 (the list) + 3 * 8 + the string)
        return {"k": [True, None, 1.5, "x" * (weight - 41)]}
    assert shape == "nested"  # 8 + 1 + (8 + 1 + the string)
    return {"k": {"j": "x" * (weight - 18)}}


@pytest.mark.parametrize("shape", ["ascii", "utf8", "list", "nested"])
def test_metadata_is_refused_above_64_kib_counted_as_documented(shape: str) -> None:
    assert MAX_METADATA_BYTES == 64 * 1024
    largest = _at_weight(shape, 64 * 1024)
    assert require_metadata("metadata", largest) == largest
    with pytest.raises(InvalidInput, match="metadata is larger than 65536 bytes"):
        require_metadata("metadata", _at_weight(shape, 64 * 1024 + 1))


# -- identities, targets, media --------------------------------------------------------------


def test_an_owner_identity_is_host_boot_pid_start_and_installation() -> None:
    owner = OwnerIdentity(host="h", boot_id="", pid=0)
    assert (owner.start_time, owner.installation_id) == (None, "")
    assert owner.describe() == "h/0"
    same = OwnerIdentity(host="h", boot_id="", pid=0, start_time=None, installation_id="")
    assert owner.same_process(same) and owner == same
    assert not owner.same_process(OwnerIdentity(host="h", boot_id="", pid=0, start_time=1))
    assert not owner.same_process(OwnerIdentity(host="h", boot_id="", pid=0, installation_id="i"))
    with pytest.raises(InvalidInput, match="host must not be empty"):
        OwnerIdentity(host="", boot_id="b", pid=1)
    with pytest.raises(InvalidInput, match="pid must be >= 0"):
        OwnerIdentity(host="h", boot_id="b", pid=-1)
    with pytest.raises(TypeError):
        OwnerIdentity(host="h", boot_id="b", pid="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        OwnerIdentity(host="h", boot_id="b", pid=1, start_time="9")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="installation_id must be a str"):
        OwnerIdentity(host="h", boot_id="b", pid=1, installation_id=None)  # type: ignore[arg-type]


def test_a_target_keeps_ids_as_text_and_optional_slots_as_none() -> None:
    target = DeliveryTarget(platform="telegram", chat_id=-100, thread_id=7, reply_to=None)  # type: ignore[arg-type]
    assert (target.chat_id, target.thread_id, target.reply_to) == ("-100", "7", None)
    assert DeliveryTarget(platform="t", chat_id="c", reply_to=42).reply_to == "42"  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="chat_id must be a str, not bool"):
        DeliveryTarget(platform="t", chat_id=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="thread_id must not be empty"):
        DeliveryTarget(platform="t", chat_id="c", thread_id="")
    with pytest.raises(InvalidInput, match="reply_to must be a str"):
        DeliveryTarget(platform="t", chat_id="c", reply_to=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="thread_id is not valid Unicode"):
        DeliveryTarget(platform="t", chat_id="c", thread_id="\ud800")


def test_a_media_item_is_a_kind_and_a_uri_with_optional_text() -> None:
    item = MediaItem(kind="image", uri="file:///a.png", caption=None, mime_type="image/png")
    assert (item.caption, item.mime_type) == (None, "image/png")
    assert MediaItem(kind="k", uri="u", caption="c").caption == "c"
    with pytest.raises(InvalidInput, match="media kind must not be empty"):
        MediaItem(kind="", uri="u")
    with pytest.raises(InvalidInput, match="media uri must be a str"):
        MediaItem(kind="k", uri=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="media caption must not be empty"):
        MediaItem(kind="k", uri="u", caption="")
    with pytest.raises(InvalidInput, match="media mime_type is not valid Unicode"):
        MediaItem(kind="k", uri="u", mime_type="\ud800")


# -- the ledger policy -------------------------------------------------------------------------


def test_the_policy_defaults_are_upstreams_constants() -> None:
    policy = LedgerPolicy()
    assert policy.max_attempts == 3
    assert policy.stale_after == timedelta(hours=24)
    assert policy.retry_backoff == (timedelta(seconds=30), timedelta(seconds=120))
    assert policy.max_retry_after == timedelta(minutes=15)
    assert LedgerPolicy(max_attempts=0).max_attempts == 0
    with pytest.raises(InvalidInput, match="max_attempts must be >= 0"):
        LedgerPolicy(max_attempts=-1)


def test_an_obligation_is_stale_from_exactly_stale_after_on() -> None:
    policy = LedgerPolicy(stale_after=timedelta(hours=2))
    assert not policy.is_stale(T0, T0 + timedelta(hours=2) - timedelta(microseconds=1))
    assert policy.is_stale(T0, T0 + timedelta(hours=2))
    assert not policy.is_stale(T0 + timedelta(hours=3), T0 + timedelta(hours=4))  # order matters


# -- receipts ------------------------------------------------------------------------------


def test_receipts_are_lists_of_str_or_int_ids_kept_as_text() -> None:
    assert receipt_ids([]) == []
    assert receipt_ids([1, "m-2", -3]) == ["1", "m-2", "-3"]
    assert receipt_ids((4,)) == ["4"]
    for bad in ("m-1", b"m-1", {"m-1"}, {"a": 1}, None, 5):
        with pytest.raises(InvalidInput, match="receipt must be a list of message ids"):
            receipt_ids(bad)
    for item in (True, 1.5, None, b"x"):
        with pytest.raises(InvalidInput, match=r"receipt\[1\] must be a str or int"):
            receipt_ids(["ok", item])
    with pytest.raises(InvalidInput, match=r"receipt\[0\] must not be empty"):
        receipt_ids([""])


# -- hashing -------------------------------------------------------------------------------


def test_unkeyed_hashes_are_upstreams_formulas() -> None:
    digest = hashlib.sha256(b"12345").hexdigest()
    assert hash_id("12345") == digest[:12]
    assert hash_sender_id("12345") == "user_" + digest[:12]
    assert hash_chat_id("telegram:12345") == "telegram:" + digest[:12]
    assert hash_chat_id("12345") == digest[:12]
    assert hash_chat_id(":12345") == hashlib.sha256(b":12345").hexdigest()[:12]
    assert hash_id("é") == hashlib.sha256("é".encode()).hexdigest()[:12]


def test_keyed_hashes_are_hmac_sha256_cut_to_24_hex() -> None:
    def mac(value: str, n: int = 24) -> str:
        return hmac.new(SECRET, value.encode(), hashlib.sha256).hexdigest()[:n]

    assert keyed_hash_id(SECRET, "12345") == mac("12345")
    assert keyed_hash_id(bytearray(SECRET), "12345", 8) == mac("12345", 8)
    assert keyed_hash_sender_id(SECRET, "12345") == "user_" + mac("12345")
    assert keyed_hash_chat_id(SECRET, "telegram:12345") == "telegram:" + mac("12345")
    assert keyed_hash_chat_id(SECRET, "12345") == mac("12345")
    assert keyed_hash_chat_id(SECRET, ":12345") == mac(":12345")
    hasher = KeyedHasher(bytearray(SECRET))
    assert hasher.secret == SECRET and isinstance(hasher.secret, bytes)
    assert hasher("12345") == mac("12345")
    label = "gateway-ledger/session-secret-fingerprint/v1"
    assert hasher.fingerprint == mac(label, 32)  # stored: it must never change


def test_a_hashing_secret_is_at_least_16_bytes_and_never_shown() -> None:
    keyed_hash_id(b"x" * 16, "v")
    for bad in (b"x" * 15, "x" * 32, None):
        with pytest.raises(InvalidInput, match="at least 16 bytes"):
            keyed_hash_id(bad, "v")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="at least 16 bytes"):
            KeyedHasher(bad)  # type: ignore[arg-type]
    assert repr(SECRET) not in repr(KeyedHasher(SECRET))
    assert "secret" not in repr(KeyedHasher(SECRET))


def test_a_replys_text_is_any_storable_text_up_to_8_mib_in_utf8() -> None:
    eight_mib = 8 * 1024 * 1024  # written out: the limit is a promise
    assert require_content("content", "") == ""  # a media-only reply
    at_cap = "é" * (eight_mib // 2)  # four times its length is over the cap; its bytes are not
    assert require_content("content", at_cap) is at_cap
    with pytest.raises(InvalidInput, match=f"^reply is larger than {eight_mib} bytes$"):
        require_content("reply", at_cap + "a")
    with pytest.raises(InvalidInput, match="content must be a str"):
        require_content("content", b"bytes")
