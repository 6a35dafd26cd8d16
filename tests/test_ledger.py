"""DeliveryLedger through its public API, on every store."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gateway_ledger.application.ledger import DeliveryLedger
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput, NotFound
from gateway_ledger.domain.obligation import compute_obligation_id

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
        from gateway_ledger.application.ledger import DeliveryLedger
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
