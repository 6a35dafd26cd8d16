"""DeliveryLedger through its public API, on every store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput, NotFound
from gateway_ledger.domain.values import MediaItem

KEY = "agent:main:telegram:dm:99"


def record(ledger: DeliveryLedger, content: str = "hello", ref: str = "m1") -> str:
    oid = compute_obligation_id(KEY, ref, content)
    return ledger.record_obligation(
        obligation_id=oid,
        session_key=KEY,
        platform="telegram",
        chat_id="99",
        thread_id="t7",
        content=content,
        reply_to="m1",
        media=[{"kind": "image", "uri": "file:///tmp/a.png", "caption": "a"}],
        metadata={"parse_mode": "MarkdownV2", "chunks": [1, 2]},
    )


def test_recording_is_idempotent_and_never_rewinds(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = record(ledger)
    assert record(ledger) == oid
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid, ["501"])
    assert record(ledger) == oid  # re-recording a delivered reply: nothing appended
    assert [h.type for h in ledger.history(oid)] == ["Recorded", "Attempting", "Delivered"]
    assert ledger.get(oid).state == "delivered"


def test_everything_needed_to_resend_is_kept(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = record(ledger)
    status = DeliveryLedger.open(store_location).get(oid)
    assert (status.platform, status.chat_id, status.thread_id, status.reply_to) == (
        "telegram",
        "99",
        "t7",
        "m1",
    )
    assert status.media[0].uri == "file:///tmp/a.png"
    assert status.metadata == {"parse_mode": "MarkdownV2", "chunks": [1, 2]}
    assert status.owner == ledger.owner
    assert status.needs_marker is False


def test_lifecycle_is_read_back_from_a_second_process(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = record(ledger)
    ledger.mark_attempting(oid)
    ledger.mark_failed(oid, "HTTP 503", "ambiguous")
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid, ["777"])
    ledger.close()
    script = textwrap.dedent(
        f"""
        import json
        from gateway_ledger.bootstrap import DeliveryLedger
        ledger = DeliveryLedger.open({store_location!r})
        print(json.dumps([h.to_dict() for h in ledger.history({oid!r})]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    history = json.loads(out)
    assert [h["type"] for h in history] == [
        "Recorded",
        "Attempting",
        "Failed",
        "Attempting",
        "Delivered",
    ]
    assert [h["version"] for h in history] == [1, 2, 3, 4, 5]
    stamps = [h["timestamp"] for h in history]
    assert stamps == sorted(stamps) and all(s.endswith("+00:00") for s in stamps)
    assert history[2]["fields"]["error"] == "HTTP 503"
    assert history[4]["fields"]["receipt"] == ["777"]


def test_unknown_ids_raise_not_found(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    for call in (ledger.get, ledger.history, ledger.mark_attempting, ledger.mark_delivered):
        with pytest.raises(NotFound, match="no obligation with id 'nope'"):
            call("nope")


def test_illegal_transition_through_the_api_appends_nothing(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = record(ledger)
    with pytest.raises(
        IllegalTransition, match=f"DeliveryObligation {oid} is pending; refused delivered"
    ):
        ledger.mark_delivered(oid)
    assert len(ledger.history(oid)) == 1


@pytest.mark.parametrize(
    "content",
    ["", "nul\x00inside", "emoji 🙂 and RTL \u202e", "x" * (1024 * 1024), "é" * 100_000],
)
def test_awkward_content_round_trips_exactly(store_location: str, content: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = record(ledger, content=content)
    assert DeliveryLedger.open(store_location).get(oid).content == content


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"platform": ""}, "platform must not be empty"),
        ({"chat_id": None}, "chat_id must be a str"),
        ({"session_key": ""}, "session_key must not be empty"),
        ({"content": "lone \udc80 surrogate"}, "content is not valid Unicode"),
        ({"content": b"bytes"}, "content must be a str"),
        ({"metadata": {"when": object()}}, "JSON cannot carry"),
        ({"media": [{"kind": "image"}]}, "uri"),
        ({"obligation_id": ""}, "obligation_id must not be empty"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    store_location: str, overrides: dict[str, object], message: str
) -> None:
    ledger = DeliveryLedger.open(store_location)
    args: dict[str, object] = {
        "obligation_id": "a" * 24,
        "session_key": KEY,
        "platform": "telegram",
        "chat_id": "99",
        "content": "ok",
    }
    args.update(overrides)
    with pytest.raises(InvalidInput, match=message):
        ledger.record_obligation(**args)  # type: ignore[arg-type]
    assert ledger.recorder.max_notification_id() in (None, 0)


# -- the bad-input matrix: every parameter, every wrong shape ---------------------------------

SURROGATE = "lone \ud800 surrogate"
GOOD: dict[str, Any] = {
    "obligation_id": "b" * 24,
    "session_key": KEY,
    "platform": "telegram",
    "chat_id": "99",
    "thread_id": "t7",
    "content": "ok",
    "reply_to": "m1",
    "media": [{"kind": "image", "uri": "file:///a.png", "caption": "c", "mime_type": "image/png"}],
    "metadata": {"parse_mode": "HTML"},
}

RECORD_REFUSALS: list[tuple[str, object, str]] = [
    ("obligation_id", 5, "obligation_id must be a str, not int"),
    ("obligation_id", None, "obligation_id must be a str, not NoneType"),
    ("obligation_id", b"x", "obligation_id must be a str, not bytes"),
    ("obligation_id", "  ", "obligation_id must not be empty"),
    ("obligation_id", "x" * 201, "obligation_id is longer than 200"),
    ("session_key", 5, "session_key must be a str, not int"),
    ("session_key", None, "session_key must be a str"),
    ("session_key", "", "session_key must not be empty"),
    ("platform", 5, "platform must be a str, not int"),
    ("platform", None, "platform must be a str"),
    ("platform", "", "platform must not be empty"),
    ("chat_id", None, "chat_id must be a str"),
    ("chat_id", 3.5, "chat_id must be a str, not float"),
    ("chat_id", True, "chat_id must be a str, not bool"),
    ("chat_id", b"99", "chat_id must be a str, not bytes"),
    ("chat_id", "", "chat_id must not be empty"),
    ("thread_id", 3.5, "thread_id must be a str, not float"),
    ("thread_id", ["t"], "thread_id must be a str, not list"),
    ("thread_id", "", "thread_id must not be empty"),
    ("reply_to", b"m1", "reply_to must be a str, not bytes"),
    ("reply_to", {}, "reply_to must be a str, not dict"),
    ("content", None, "content must be a str, not NoneType"),
    ("content", 5, "content must be a str, not int"),
    ("content", b"x", "content must be a str, not bytes"),
    ("content", "x" * (8 * 1024 * 1024 + 1), "content is larger than"),
    ("media", 5, "media must be a list of media items, not int"),
    ("media", "abc", "media must be a list of media items, not str"),
    ("media", {"kind": "image", "uri": "u"}, "media must be a list of media items, not dict"),
    ("media", [5], "a media item must be a MediaItem or a mapping, not int"),
    ("media", [{"kind": "image"}], "uri"),
    ("media", [{"kind": "image", "uri": "u", "size": 1}], "size"),
    ("media", [{"kind": 5, "uri": "u"}], "media kind must be a str"),
    ("media", [{"kind": "image", "uri": "u", "caption": 5.5}], "media caption must be a str"),
    ("metadata", 5, "metadata must be a mapping, not int"),
    ("metadata", "ab", "metadata must be a mapping, not str"),
    ("metadata", [("a", 1)], "metadata must be a mapping, not list"),
    ("metadata", {1: "x"}, "keys must be str"),
    ("metadata", {"a": object()}, "JSON cannot carry"),
    ("metadata", {"a": {1, 2}}, "JSON cannot carry"),
    ("metadata", {"a": b"x"}, "JSON cannot carry"),
    ("metadata", {"a": [float("inf")]}, "JSON cannot carry"),
    ("metadata", {"a": float("nan")}, "JSON cannot carry"),
    ("metadata", {"a": {"b": 2**64}}, "64-bit"),
    ("metadata", {"_type_": "datetime_iso", "_data_": "x"}, "reserved"),
    ("parts", "ok", "parts must be a sequence of str, not str"),
    ("parts", 5, "parts must be a sequence of str, not int"),
    ("parts", [1, 2], "parts\\[0\\] must be a str, not int"),
    ("parts", ["o"], "parts must be the content split"),
]
SURROGATE_FIELDS: list[tuple[str, object, str]] = [
    ("obligation_id", SURROGATE, "obligation_id is not valid Unicode"),
    ("session_key", SURROGATE, "session_key is not valid Unicode"),
    ("platform", SURROGATE, "platform is not valid Unicode"),
    ("chat_id", SURROGATE, "chat_id is not valid Unicode"),
    ("thread_id", SURROGATE, "thread_id is not valid Unicode"),
    ("reply_to", SURROGATE, "reply_to is not valid Unicode"),
    ("content", SURROGATE, "content is not valid Unicode"),
    ("media", [{"kind": SURROGATE, "uri": "u"}], "media kind is not valid Unicode"),
    ("media", [{"kind": "k", "uri": SURROGATE}], "media uri is not valid Unicode"),
    ("media", [{"kind": "k", "uri": "u", "caption": SURROGATE}], "caption is not valid Unicode"),
    ("media", [{"kind": "k", "uri": "u", "mime_type": SURROGATE}], "mime_type is not valid"),
    ("metadata", {SURROGATE: 1}, "metadata key is not valid Unicode"),
    ("metadata", {"a": SURROGATE}, "metadata\\['a'\\] is not valid Unicode"),
    ("metadata", {"a": [{"b": SURROGATE}]}, "is not valid Unicode"),
    ("parts", ["ok", SURROGATE], "parts\\[1\\] is not valid Unicode"),
]


def stored_events(ledger: DeliveryLedger) -> int:
    return len(ledger.recorder.select_notifications(start=None, limit=100_000))


def test_every_bad_record_argument_is_refused_before_anything_is_written(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    for field, value, message in RECORD_REFUSALS + SURROGATE_FIELDS:
        args = {**GOOD, field: value}
        with pytest.raises(InvalidInput, match=message):
            ledger.record_obligation(**args)
        assert stored_events(ledger) == 0, (field, value)


def test_awkward_text_in_every_field_is_stored_and_read_back_exactly(store_location: str) -> None:
    awkward = "nul\x00 tab\t emoji 🙂 rtl \u202e zwj \u200d bom \ufeff"
    # Id and platform are kept in clear, in text columns: NUL is refused there (issue 14,
    # tests/test_input_hardening.py); the rest of this awkward text is kept exactly.
    clear = awkward.replace("\x00", "")
    args = {
        "obligation_id": clear,
        "session_key": awkward,
        "platform": clear,
        "chat_id": awkward,
        "thread_id": awkward,
        "reply_to": awkward,
        "content": awkward,
        "media": [{"kind": awkward, "uri": awkward, "caption": awkward, "mime_type": awkward}],
        "metadata": {awkward: [awkward, {awkward: -(2**63)}, 2**64 - 1, -0.5, 1e308, None]},
        "parts": [awkward[:3], awkward[3:]],
    }
    DeliveryLedger.open(store_location).record_obligation(**args)
    status = DeliveryLedger.open(store_location).get(clear)
    assert (status.obligation_id, status.session_key, status.platform) == (clear, awkward, clear)
    assert (status.chat_id, status.thread_id, status.reply_to, status.content) == (awkward,) * 4
    assert status.media == (
        MediaItem(kind=awkward, uri=awkward, caption=awkward, mime_type=awkward),
    )
    assert status.metadata == args["metadata"]
    assert status.parts == (awkward[:3], awkward[3:])


def test_numeric_platform_ids_are_kept_as_text(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    ledger.record_obligation(**{**GOOD, "chat_id": -1002285219667, "thread_id": 17585})
    ledger.mark_attempting(GOOD["obligation_id"])
    ledger.mark_delivered(GOOD["obligation_id"], [501, "502"])
    status = DeliveryLedger.open(store_location).get(GOOD["obligation_id"])
    assert (status.chat_id, status.thread_id, status.receipt) == (
        "-1002285219667",
        "17585",
        ("501", "502"),
    )


def test_every_bad_mark_failed_argument_is_refused_before_anything_is_written(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.mark_attempting(oid)
    before = stored_events(ledger)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"obligation_id": 5}, "obligation_id must be a non-empty str"),
        ({"obligation_id": None}, "obligation_id must be a non-empty str"),
        ({"obligation_id": ""}, "obligation_id must be a non-empty str"),
        ({"error": 5}, "error must be a str"),
        ({"error": None}, "error must be a str"),
        ({"error": b"503"}, "error must be a str"),
        ({"classification": "bogus"}, "unknown error classification 'bogus'"),
        ({"classification": 5}, "unknown error classification 5"),
        ({"classification": None}, "unknown error classification None"),
        ({"retry_after": "30"}, "retry_after must be a finite, non-negative number"),
        ({"retry_after": -1}, "retry_after must be a finite, non-negative number"),
        ({"retry_after": float("inf")}, "retry_after must be a finite, non-negative number"),
        ({"retry_after": float("nan")}, "retry_after must be a finite, non-negative number"),
        ({"retry_after": True}, "retry_after must be a finite, non-negative number"),
    ]
    for override, message in cases:
        args: dict[str, Any] = {"obligation_id": oid, "error": "HTTP 503", **override}
        with pytest.raises(InvalidInput, match=message):
            ledger.mark_failed(**args)
        assert stored_events(ledger) == before, override
    assert ledger.get(oid).state == "attempting"


def test_failure_text_is_kept_never_refused(store_location: str) -> None:
    """Error text is diagnostics: a lone surrogate becomes '?', never a lost failure."""
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.mark_attempting(oid)
    ledger.mark_failed(oid, "bad \udcff byte\x00" + "x" * 600, "rejected", retry_after=30)
    status = DeliveryLedger.open(store_location).get(oid)
    assert status.last_error == ("bad ? byte\x00" + "x" * 600)[:500]
    assert (status.error_class, status.retry_after) == ("rejected", 30.0)


@pytest.mark.parametrize(
    "receipt, message",
    [
        ([None], "receipt\\[0\\] must be a str or int, not NoneType"),
        ([b"501"], "receipt\\[0\\] must be a str or int, not bytes"),
        (["1", 1.5], "receipt\\[1\\] must be a str or int, not float"),
        ([True], "receipt\\[0\\] must be a str or int, not bool"),
        ([""], "receipt\\[0\\] must not be empty"),
        ([SURROGATE], "receipt\\[0\\] is not valid Unicode"),
        ({"id": "1"}, "receipt must be a list of message ids, not dict"),
        (b"501", "receipt must be a list of message ids, not bytes"),
        (1.5, "receipt must be a list of message ids, not float"),
    ],
)
def test_receipts_that_are_not_message_ids_are_refused(
    store_location: str, receipt: object, message: str
) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.mark_attempting(oid)
    with pytest.raises(InvalidInput, match=message):
        ledger.mark_delivered(oid, receipt)  # type: ignore[arg-type]
    assert [h.type for h in ledger.history(oid)] == ["Recorded", "Attempting"]
