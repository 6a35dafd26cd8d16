"""Issue 14, bad input through the API: refused the same way on both stores, nothing written.

A NUL in a field kept in clear (obligation id, platform, owner, operators' names and
reasons) was accepted, and on PostgreSQL every later read of the views then failed with
``DataError``; a lone surrogate in an id given to a read or mark call raised
``UnicodeEncodeError``; a second record of an id with other content passed silently;
metadata and operators' texts had no size cap; a schema name could carry a newline.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.errors import ConflictingRecord, InvalidInput
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import (
    MAX_METADATA_BYTES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    OwnerIdentity,
)
from gateway_ledger.infrastructure.eventstore.postgres import parse_postgres_url
from tests.conftest import PG_BASE_URL

KEY = "agent:main:telegram:dm:99"
GOOD: dict[str, Any] = {
    "obligation_id": "c" * 24,
    "session_key": KEY,
    "platform": "telegram",
    "chat_id": "99",
    "content": "hello",
}
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
CLI = str(Path(sys.executable).parent / "gateway-ledger")

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
unstorable = surrogates | st.just("\x00")
"""What no field can hold in clear: a lone surrogate (no UTF-8), a NUL (no PG text)."""


def with_one(bad: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Any text with one ``bad`` character somewhere in it."""
    return st.tuples(st.text(max_size=12), bad, st.text(max_size=12)).map("".join)


def stored_events(app: Any) -> int:
    return len(app.recorder.select_notifications(start=None, limit=100_000))


HYPOTHESIS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- NUL and surrogates: one rule, both stores ------------------------------------------------


def test_nul_or_surrogate_in_any_clear_field_is_refused_identically(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.mark_attempting(oid)
    before = stored_events(ledger)

    @HYPOTHESIS
    @given(bad=with_one(unstorable))
    def check(bad: str) -> None:
        attempts = {
            "obligation_id": lambda: ledger.record_obligation(**{**GOOD, "obligation_id": bad}),
            "platform": lambda: ledger.record_obligation(
                **{**GOOD, "obligation_id": "d" * 24, "platform": bad}
            ),
            "retry by": lambda: ledger.retry(oid, by_operator=bad),
            "abandon reason": lambda: ledger.abandon(oid, "operator", bad),
            "list platform": lambda: ledger.list(platform=bad),
            "owner host": lambda: OwnerIdentity(host=bad, boot_id="b", pid=1),
            "owner boot_id": lambda: OwnerIdentity(host="h", boot_id=bad, pid=1),
            "owner installation": lambda: OwnerIdentity(
                host="h", boot_id="b", pid=1, installation_id=bad
            ),
            "forget by": lambda: ledger.forget_session(KEY, requested_by=bad),
        }
        for what, attempt in attempts.items():
            with pytest.raises(InvalidInput):
                attempt()
            assert stored_events(ledger) == before, what

    check()
    # Still readable, every view included (on PostgreSQL a NUL made these raise DataError).
    assert ledger.get(oid).state == "attempting"
    assert ledger.stats().total == 1
    assert [e.obligation_id for e in ledger.list()] == [oid]


def test_nul_is_refused_in_platform_and_id_and_the_store_stays_readable(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    for field, message in (("platform", "platform must not contain NUL"), ("obligation_id", "NUL")):
        with pytest.raises(InvalidInput, match=message):
            ledger.record_obligation(**{**GOOD, field: GOOD[field][:3] + "\x00x"})
    assert stored_events(ledger) == 0
    ledger.record_obligation(**GOOD)
    assert ledger.stats().total == 1
    assert len(ledger.list()) == 1


def test_nul_in_a_sealed_payload_field_is_kept_exactly_on_both_stores(
    store_location: str,
) -> None:
    """Message text and chat ids ride inside the event's JSON (bytes on both stores)."""
    ledger = DeliveryLedger.open(store_location)
    text = "nul\x00inside"
    oid = ledger.record_obligation(**{**GOOD, "chat_id": text, "content": text})
    status = DeliveryLedger.open(store_location).get(oid)
    assert (status.chat_id, status.content) == (text, text)
    assert ledger.stats().total == 1


def test_bad_ids_in_read_and_mark_calls_are_invalid_input(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    before = stored_events(ledger)
    calls = {
        "get": ledger.get,
        "history": ledger.history,
        "history at": lambda i: ledger.history(i, T0),
        "timeline": ledger.timeline,
        "exists": ledger.exists,
        "is_erased": ledger.is_erased,
        "mark_attempting": ledger.mark_attempting,
        "mark_delivered": ledger.mark_delivered,
        "mark_failed": lambda i: ledger.mark_failed(i, "x"),
        "abandon": lambda i: ledger.abandon(i, "operator", "why"),
        "retry": ledger.retry,
    }

    @HYPOTHESIS
    @given(bad=with_one(unstorable))
    def check(bad: str) -> None:
        for name, call in calls.items():
            with pytest.raises(InvalidInput, match="obligation_id"):
                call(bad)
            assert stored_events(ledger) == before, name

    check()
    assert ledger.get(oid).state == "pending"


def test_session_store_lookups_refuse_surrogates_and_clear_nul(
    store_location: str, tmp_path: Path
) -> None:
    store = SessionStore.open(store_location, secret_dir=tmp_path)
    ctx = store.resolve(SessionSource(platform="telegram", chat_id="1"), T0)
    before = stored_events(store)

    @HYPOTHESIS
    @given(bad=with_one(surrogates), nul=with_one(st.just("\x00")))
    def check(bad: str, nul: str) -> None:
        for call in (
            lambda: store.seen("telegram", "m1", chat_id=bad),
            lambda: store.seen("telegram", bad, chat_id="1"),
            lambda: store.seen(bad, "m1", chat_id="1"),
            lambda: store.seen(nul, "m1", chat_id="1"),
            lambda: store.history(bad),
            lambda: store.sessions_of(bad),
            lambda: store.reset(bad),
            lambda: store.mark_resume_pending(bad),
            lambda: store.mark_resume_pending(ctx.session_id, reason=bad),
            lambda: store.mark_resume_pending(ctx.session_id, reason=nul),
            lambda: store.export_transcript(bad, tmp_path / "out"),
            lambda: SessionSource(platform=nul, chat_id="1"),
            lambda: SessionSource(platform="telegram", chat_id="1", profile=nul),
        ):
            with pytest.raises(InvalidInput):
                call()
        assert stored_events(store) == before

    check()


# -- a second record of one id ----------------------------------------------------------------


@pytest.mark.parametrize("encrypt", [True, False])
def test_recording_an_id_again_with_other_content_is_refused(
    store_location: str, encrypt: bool
) -> None:
    ledger = DeliveryLedger.open(store_location, encrypt=encrypt)
    oid = ledger.record_obligation(**GOOD, metadata={"parse_mode": "HTML"}, thread_id="t1")
    before = stored_events(ledger)
    # The same record again (another process, after a crash) stays idempotent.
    again = DeliveryLedger.open(store_location, encrypt=encrypt)
    assert again.record_obligation(**GOOD, metadata={"parse_mode": "HTML"}, thread_id="t1") == oid
    changes: list[tuple[dict[str, Any], str]] = [
        ({"content": "another reply"}, "content"),
        ({"chat_id": "100"}, "target"),
        ({"platform": "discord"}, "target"),
        ({"session_key": KEY + "x"}, "session_key"),
        ({"metadata": {"parse_mode": "Markdown"}}, "metadata"),
        ({"media": [{"kind": "image", "uri": "file:///a.png"}]}, "media"),
        ({"parts": ["hel", "lo"]}, "parts"),
    ]
    for change, field in changes:
        args = {**GOOD, "metadata": {"parse_mode": "HTML"}, "thread_id": "t1", **change}
        with pytest.raises(ConflictingRecord, match=f"obligation {oid} .*{field}") as raised:
            again.record_obligation(**args)
        assert raised.value.fields == (field,)
        assert "another reply" not in str(raised.value)  # names fields, never values
        assert stored_events(again) == before
    assert again.get(oid).content == "hello"


def test_after_erasure_a_record_again_cannot_be_compared_and_changes_nothing(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.forget_session(KEY)
    before = stored_events(ledger)
    assert ledger.record_obligation(**{**GOOD, "content": "other"}) == oid
    assert stored_events(ledger) == before


# -- caps -------------------------------------------------------------------------------------


def test_metadata_operator_names_and_reasons_have_caps(store_location: str, tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    before = stored_events(ledger)
    too_big = {"blob": "x" * MAX_METADATA_BYTES}
    with pytest.raises(InvalidInput, match=f"metadata is larger than {MAX_METADATA_BYTES}"):
        ledger.record_obligation(**{**GOOD, "obligation_id": "e" * 24, "metadata": too_big})
    nested = {"rows": [{"k": "é" * 1000} for _ in range(40)]}  # 80 KB of two-byte characters
    with pytest.raises(InvalidInput, match="metadata is larger"):
        ledger.record_obligation(**{**GOOD, "obligation_id": "e" * 24, "metadata": nested})
    with pytest.raises(InvalidInput, match=f"by_operator is longer than {MAX_NAME_CHARS}"):
        ledger.retry(oid, by_operator="o" * (MAX_NAME_CHARS + 1))
    with pytest.raises(InvalidInput, match=f"requested_by is longer than {MAX_NAME_CHARS}"):
        ledger.forget_session(KEY, requested_by="o" * (MAX_NAME_CHARS + 1))
    with pytest.raises(InvalidInput, match=f"abandon reason is longer than {MAX_REASON_CHARS}"):
        ledger.abandon(oid, "operator", "r" * (MAX_REASON_CHARS + 1))
    for empty in ("", "   "):
        with pytest.raises(InvalidInput, match="abandon reason must not be empty"):
            ledger.abandon(oid, "operator", empty)
    with pytest.raises(InvalidInput, match="abandon reason must not be empty"):
        ledger.abandon(oid)
    assert stored_events(ledger) == before
    # At the caps, accepted.
    ledger.record_obligation(
        **{**GOOD, "obligation_id": "f" * 24, "metadata": {"b": "x" * (MAX_METADATA_BYTES - 64)}}
    )
    ledger.abandon(oid, "operator", "r" * MAX_REASON_CHARS)
    assert ledger.get(oid).state == "abandoned"

    store = SessionStore.open(store_location, secret_dir=tmp_path)
    ctx = store.resolve(SessionSource(platform="telegram", chat_id="1"), T0)
    with pytest.raises(InvalidInput, match=f"reason is longer than {MAX_REASON_CHARS}"):
        store.mark_resume_pending(ctx.session_id, reason="r" * 1024 * 1024)
    store.mark_resume_pending(ctx.session_id, reason="r" * MAX_REASON_CHARS)


def test_the_console_refuses_an_empty_abandon_reason(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    oid = ledger.record_obligation(**GOOD)
    ledger.close()
    done = subprocess.run(
        [CLI, "abandon", oid, "--reason", "", "--db", store_location],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "abandon reason must not be empty" in done.stderr
    assert "Traceback" not in done.stderr
    assert DeliveryLedger.open(store_location).get(oid).state == "pending"


@pytest.mark.parametrize("schema", ["evil%0A", "evil%0D", "ev%00il", "a%09b", "x%0Ay"])
def test_postgres_schema_names_with_control_characters_are_refused(schema: str) -> None:
    with pytest.raises(InvalidInput, match="invalid schema name"):
        parse_postgres_url(f"{PG_BASE_URL}?schema={schema}")
    with pytest.raises(InvalidInput, match="invalid schema name"):
        DeliveryLedger.open(f"{PG_BASE_URL}?schema={schema}")
