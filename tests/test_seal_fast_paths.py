"""The sealing and transcoding shortcuts store exactly what the long way stored."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from gateway_ledger.bootstrap import build_transcoder
from gateway_ledger.domain.values import DeliveryTarget, OwnerIdentity
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED, _with_placeholders


def test_tagged_placeholders_encode_to_the_same_bytes_as_the_copy() -> None:
    transcoder = build_transcoder()
    target = DeliveryTarget(platform="telegram", chat_id=42, thread_id="t", reply_to="m-1")
    changes = {"chat_id": ERASED, "reply_to": ERASED}
    tagged = transcoder.tagged_with(target, changes)  # type: ignore[attr-defined]
    copy = _with_placeholders(target, changes)
    assert transcoder.encode({"target": tagged}) == transcoder.encode({"target": copy})
    assert orjson.loads(transcoder.encode({"target": tagged}))["target"]["_data_"] == {
        "platform": "telegram",
        "chat_id": ERASED,
        "thread_id": "t",
        "reply_to": ERASED,
    }


def test_a_reused_encoding_of_a_frozen_value_is_exactly_its_own() -> None:
    transcoder = build_transcoder()
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    owners = [OwnerIdentity(host=f"h{i}", boot_id="b", pid=i) for i in range(200)]
    first = [transcoder.encode({"by": o, "at": now}) for o in owners]
    again = [transcoder.encode({"by": o, "at": now}) for o in owners]  # memo hits and refills
    assert first == again
    for owner, data in zip(owners, again, strict=True):
        decoded = transcoder.decode(data)
        assert decoded["by"] == owner
        assert decoded["at"] == now
