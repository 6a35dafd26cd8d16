"""Privacy of the session half: nothing personal at rest, and one erasure for both halves.

Known user ids and names, chat ids and names, message texts and platform message ids go in
through ``SessionStore.resolve/append`` and the ``DeliveryLedger``; the raw store is read
as bytes (SQLite .db/-wal/-shm; every row of every PostgreSQL table of the schema,
snapshots included). After ``forget_session`` the conversation replays as ``[erased]``,
the export says ``[erased]``, the source still gets a (fresh) session, and no key left in
the store opens what was erased, even with the master key.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from privacy_support import store_bytes

from gateway_ledger.application.privacy.erasure import erasures
from gateway_ledger.bootstrap import DeliveryLedger, SessionStore, forget_session
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.route import route_uuid
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV, derive, load_master_key
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED
from tests.conftest import drop_postgres_schema, new_postgres_url

T0 = datetime(2026, 7, 20, 10, 0, tzinfo=UTC)
USER_ID = "u-77001234"
USER_ALT = "u-alt-55501"
USER_NAME = "Philippa Zanzibar"
CHAT_ID = "c-80808042"
CHAT_ALT = "c-alt-61616"
CHAT_NAME = "Zanzibar Family Secrets"
TOPIC = "Inheritance of aunt Mathilde"
THREAD_ID = "th-9091929"
SCOPE_ID = "guild-3141592"
PARENT_ID = "parent-2718"
SOURCE_MESSAGE_ID = "srcmsg-112358"
TEXTS = [f"Secret number {i}: the vault code is {i * 7919:07d}" for i in range(25)]
PLATFORM_IDS = [f"pmid-{i:04d}-4411" for i in range(25)]
REPLY = "Your appointment at the fertility clinic is confirmed"

SOURCE = SessionSource(
    platform="telegram",
    chat_id=CHAT_ID,
    chat_name=CHAT_NAME,
    chat_type="group",
    user_id=USER_ID,
    user_name=USER_NAME,
    thread_id=THREAD_ID,
    chat_topic=TOPIC,
    user_id_alt=USER_ALT,
    chat_id_alt=CHAT_ALT,
    scope_id=SCOPE_ID,
    parent_chat_id=PARENT_ID,
    message_id=SOURCE_MESSAGE_ID,
)
SECRETS = [
    USER_ID,
    USER_ALT,
    USER_NAME,
    CHAT_ID,
    CHAT_ALT,
    CHAT_NAME,
    TOPIC,
    THREAD_ID,
    SCOPE_ID,
    PARENT_ID,
    SOURCE_MESSAGE_ID,
    REPLY,
    *TEXTS,
    *PLATFORM_IDS,
]


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    return tmp_path / "secrets"


@pytest.fixture
def other_location(backend: str, tmp_path: Path) -> Iterator[str]:
    """A second, separate store of the same kind (another file, another schema)."""
    if backend == "sqlite":
        yield str(tmp_path / "sessions.db")
        return
    url = new_postgres_url()
    try:
        yield url
    finally:
        drop_postgres_schema(url)


def converse(store: SessionStore, ledger: DeliveryLedger) -> tuple[str, str]:
    """25 messages (a snapshot at 20), one reply owed in the ledger: (key, session id)."""
    ctx = store.resolve(SOURCE, T0)
    for i, (text, pmid) in enumerate(zip(TEXTS, PLATFORM_IDS, strict=True)):
        again = store.resolve(SOURCE, T0 + timedelta(seconds=i))
        assert again.session_id == ctx.session_id
        store.append(again, "user", text, pmid, now=T0 + timedelta(seconds=i))
    ledger.record_obligation(
        obligation_id="reply-1",
        session_key=ctx.key,
        platform="telegram",
        chat_id=CHAT_ID,
        thread_id=THREAD_ID,
        reply_to=PLATFORM_IDS[-1],
        content=REPLY,
        metadata={"user_name": USER_NAME},
    )
    store.take_snapshot(route_uuid(ctx.key))  # routes snapshot every 20 rotations: force one
    return ctx.key, ctx.session_id


def assert_no_secret(raw: bytes, extra: tuple[str, ...] = ()) -> None:
    for secret in (*SECRETS, *extra):
        assert secret.encode() not in raw, f"{secret!r} found in clear at rest"


def snapshot_count(store: SessionStore) -> int:
    snapshots = store.snapshots
    assert snapshots is not None
    return sum(
        len(snapshots.recorder.select_events(originator_id=n.originator_id))
        for n in store.recorder.select_notifications(None, 1000)
        if n.originator_version == 1
    )


@pytest.mark.parametrize("raw_keys", [False, True], ids=["keyed", "raw_keys"])
def test_no_personal_data_of_either_half_in_clear_at_rest(
    store_location: str, secret_dir: Path, raw_keys: bool
) -> None:
    store = SessionStore.open(store_location, secret_dir=secret_dir, raw_keys=raw_keys)
    ledger = DeliveryLedger.open(store_location)
    key, session_id = converse(store, ledger)
    assert snapshot_count(store) >= 2  # the Session and its route were snapshotted
    # A fresh process reads everything back in clear (snapshot + events).
    fresh = SessionStore.open(store_location, secret_dir=secret_dir, raw_keys=raw_keys)
    assert [m.content for m in fresh.history(session_id)] == TEXTS
    assert [m.platform_message_id for m in fresh.history(session_id, last=3)] == PLATFORM_IDS[-3:]
    assert fresh.seen(SOURCE, PLATFORM_IDS[0]) and not fresh.seen(SOURCE, "pmid-unknown")
    assert fresh.append(fresh.resolve(SOURCE, T0), "user", "dup", PLATFORM_IDS[3]).duplicate
    assert fresh.load_session(session_id).source == SOURCE
    assert fresh.resolve(SOURCE, T0 + timedelta(minutes=1)).key == key
    ledger.recoverable.catch_up()  # the recovery projection copies clear fields only
    assert [e.obligation_id for e in ledger.recoverable.entries()] == ["reply-1"]
    raw = store_bytes(store_location, store, ledger, fresh)
    assert b"reply-1" in raw
    assert session_id.encode() in raw  # the scan does see the store's content
    # raw_keys: the key embeds the raw chat id and user id: sealed, like them.
    assert_no_secret(raw, (key,) if raw_keys else ())
    assert b'"role":"user"' in raw and b'"platform":"telegram"' in raw  # audit fields clear


def test_forget_session_erases_both_halves(
    store_location: str, secret_dir: Path, tmp_path: Path
) -> None:
    store = SessionStore.open(store_location, secret_dir=secret_dir)
    ledger = DeliveryLedger.open(store_location)
    key, session_id = converse(store, ledger)
    store.close()
    ledger.close()
    sealed_before = sealed_blobs(store_location, secret_dir)

    report = forget_session(store_location, key, requested_by="dpo")

    assert report.sessions == (session_id,)
    assert report.abandoned == ("reply-1",)
    assert len(report.destroyed_keys) == 1  # one subject, one key, for both halves
    if not store_location.startswith("postgresql://"):
        assert report.wal_truncated is True
    (erasure,) = erasures(DeliveryLedger.open(store_location))
    assert erasure.sessions == [session_id] and erasure.requested_by == "dpo"

    fresh = SessionStore.open(store_location, secret_dir=secret_dir)
    history = fresh.history(session_id)
    assert [m.seq for m in history] == list(range(1, 26))  # every event still replays
    assert {m.content for m in history} == {ERASED}
    assert {m.platform_message_id for m in history} == {ERASED}
    assert {m.role for m in history} == {"user"}  # the non-personal facts survive
    old = fresh.load_session(session_id)  # from its snapshot and the events after it
    assert (old.key, old.source.user_name, old.source.chat_id) == (ERASED, ERASED, ERASED)
    assert old.message_count == 25 and old.suspended
    exported = fresh.export_transcript(session_id, tmp_path / "export")
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(lines) == 25 and {x["content"] for x in lines} == {ERASED}
    status = DeliveryLedger.open(store_location).get("reply-1")
    assert (status.content, status.state, status.abandon_reason) == (ERASED, "abandoned", "erased")

    # The same person writes again: a fresh session under a fresh data key, readable.
    ctx = fresh.resolve(SOURCE, T0 + timedelta(minutes=5))
    assert ctx.is_new and ctx.key == key and ctx.session_id != session_id
    assert ctx.previous_session_id == session_id and ctx.reset_reason == "suspended"
    fresh.append(ctx, "user", "a new beginning", "pmid-new", now=T0 + timedelta(minutes=5))
    again = SessionStore.open(store_location, secret_dir=secret_dir)
    assert [m.content for m in again.history(ctx.session_id)] == ["a new beginning"]
    assert again.load_session(ctx.session_id).source == SOURCE

    raw = store_bytes(store_location, fresh, again)
    assert_no_secret(raw)
    assert_unrecoverable(store_location, secret_dir, sealed_before, report.subject_id)


def sealed_blobs(location: str, secret_dir: Path) -> list[tuple[str, bytes]]:
    """Every ciphertext in the store, events and snapshots of both applications."""
    store = SessionStore.open(location, secret_dir=secret_dir)
    ledger = DeliveryLedger.open(location)
    states = [
        n.state for app in (store, ledger) for n in app.recorder.select_notifications(None, 1000)
    ]
    assert store.snapshots is not None
    for n in store.recorder.select_notifications(None, 1000):
        states += [s.state for s in store.snapshots.recorder.select_events(n.originator_id)]
    store.close()
    ledger.close()
    blobs = []
    for state in states:
        envelope = orjson.loads(state).get("_sealed_")
        if envelope and "c" in envelope:
            blobs.append((envelope["s"], base64.b64decode(envelope["c"])))
    return blobs


def assert_unrecoverable(
    location: str, secret_dir: Path, sealed_before: list[tuple[str, bytes]], subject: str
) -> None:
    """The attacker holds the master key and the store: no key left opens the erased data."""
    master = load_master_key(location)
    wrap = AESGCM(derive(master, "gateway-ledger/wrap-data-keys/v1"))
    ledger = DeliveryLedger.open(location)
    keys = []
    for key_id, subject_id, wrapped in ledger.private_mapper.keyring.table.rows():
        aad = f"gateway-ledger/data-key/v1|{key_id}|{subject_id}".encode()
        keys.append(AESGCM(wrap.decrypt(wrapped[:12], wrapped[12:], aad)))
    ledger.close()
    assert keys, "the new session's key must be there"
    erased = [blob for s, blob in sealed_before if s == subject]
    assert len(erased) >= 25 + 2 + 1 + 2  # messages, Started/Opened, reply, snapshots
    for blob in erased:
        for aead in keys:
            with pytest.raises(InvalidTag):
                aead.decrypt(blob[:12], blob[12:], None)


def test_session_store_in_another_store_is_erased_too(
    store_location: str, other_location: str, secret_dir: Path, tmp_path: Path
) -> None:
    store = SessionStore.open(other_location, secret_dir=secret_dir)
    ledger = DeliveryLedger.open(store_location)
    key, session_id = converse(store, ledger)
    store.close()
    ledger.close()
    with pytest.raises(InvalidInput, match="no session store"):
        forget_session(store_location, key, sessions=store_location)
    report = forget_session(store_location, key, sessions=other_location)
    assert report.sessions == (session_id,) and len(report.destroyed_keys) == 2
    fresh = SessionStore.open(other_location, secret_dir=secret_dir)
    assert {m.content for m in fresh.history(session_id)} == {ERASED}
    assert DeliveryLedger.open(store_location).get("reply-1").content == ERASED
    assert_no_secret(store_bytes(other_location, fresh))
    ledger_only = store_bytes(store_location)
    assert_no_secret(ledger_only)
    assert b"gateway_sessions" not in ledger_only  # the failed look-up created no tables


def test_cli_forget_with_a_separate_session_store(
    sqlite_location: str, tmp_path: Path, secret_dir: Path
) -> None:
    sessions_db = str(tmp_path / "sessions.db")
    store = SessionStore.open(sessions_db, secret_dir=secret_dir)
    ledger = DeliveryLedger.open(sqlite_location)
    key, session_id = converse(store, ledger)
    store.close()
    ledger.close()
    exe = Path(sys.executable).with_name("gateway-ledger")
    args = ["sessions", "forget", key, "--db", sqlite_location, "--sessions-db", sessions_db]
    done = subprocess.run(
        [str(exe), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    assert out["sessions"] == [session_id] and out["abandoned"] == ["reply-1"]
    assert key not in done.stdout and CHAT_ID not in done.stdout
    fresh = SessionStore.open(sessions_db, secret_dir=secret_dir)
    assert {m.content for m in fresh.history(session_id)} == {ERASED}


def test_encrypt_false_session_store_writes_clear_and_reads_sealed(
    store_location: str, secret_dir: Path
) -> None:
    sealed = SessionStore.open(store_location, secret_dir=secret_dir)
    ctx = sealed.resolve(SOURCE, T0)
    sealed.append(ctx, "user", TEXTS[0], PLATFORM_IDS[0], now=T0)
    clear = SessionStore.open(store_location, secret_dir=secret_dir, encrypt=False)
    ctx2 = clear.resolve(SOURCE, T0 + timedelta(seconds=1))
    assert ctx2.session_id == ctx.session_id
    clear.append(ctx2, "user", "spoken in clear", "pmid-clear", now=T0)
    assert [m.content for m in clear.history(ctx.session_id)] == [TEXTS[0], "spoken in clear"]
    assert clear.seen(SOURCE, "pmid-clear") and sealed.seen(SOURCE, PLATFORM_IDS[0])
    raw = store_bytes(store_location, sealed, clear)
    assert b"spoken in clear" in raw  # encrypt=False: stored as upstream would
    assert TEXTS[0].encode() not in raw and USER_NAME.encode() not in raw
    # Inbound dedupe never keeps raw platform ids, whatever the setting.
    assert b"pmid-clear" not in raw.replace(b'"platform_message_id":"pmid-clear"', b"")


def test_logs_of_the_session_half_carry_no_personal_data(
    store_location: str, secret_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="gateway_ledger")
    store = SessionStore.open(store_location, secret_dir=secret_dir, raw_keys=True)
    ledger = DeliveryLedger.open(store_location)
    key, _ = converse(store, ledger)
    ledger.forget_session(key, sessions=store)
    assert "erased" in caplog.text
    for secret in [*SECRETS, key]:
        assert secret not in caplog.text
