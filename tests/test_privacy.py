"""Privacy at the byte level: no personal data in clear at rest, and erasure that keeps history.

Known user ids, chat ids and texts go in through the public API; then the raw store is
read as bytes (SQLite: the .db, -wal and -shm files; PostgreSQL: every row of every table
in the schema) and none of them may appear. After ``forget_session`` they cannot be
recovered with the master key either.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from privacy_support import store_bytes

from gateway_ledger.application.privacy.erasure import erasures
from gateway_ledger.bootstrap import DeliveryLedger, forget_session
from gateway_ledger.domain.errors import InvalidInput, LedgerError
from gateway_ledger.infrastructure.privacy.keyring import MasterKeyMismatch
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV, derive, load_master_key
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED

USER_ID = "u-48151623"
CHAT_ID = "c-90210777"
THREAD_ID = "th-31337"
REPLY_TO = "msg-2718281"
USER_NAME = "Wilhelmina Quux"
TEXT = "The treasure is buried under the blue oak"
SECOND_TEXT = "Remember the password octopus-lantern"
ERROR_TEXT = f"timeout talking to chat {CHAT_ID}"
RECEIPT = "rcpt-1618033"
SESSION_KEY = f"agent:main:telegram:group:{CHAT_ID}:{USER_ID}"
OTHER_KEY = "agent:main:telegram:dm:c-someone-else"
OTHER_TEXT = "Unrelated reply for another person"

SECRETS = [USER_ID, CHAT_ID, THREAD_ID, REPLY_TO, USER_NAME, TEXT, SECOND_TEXT, RECEIPT]


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL stores keep their master key file in a directory: use a private one."""
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)


def record_known(ledger: DeliveryLedger) -> list[str]:
    """One delivered, one failed and one pending obligation of the subject, one of another."""
    delivered = ledger.record_obligation(
        obligation_id="o-delivered",
        session_key=SESSION_KEY,
        platform="telegram",
        chat_id=CHAT_ID,
        thread_id=THREAD_ID,
        reply_to=REPLY_TO,
        content=TEXT,
        parts=[TEXT[:10], TEXT[10:]],
        media=[{"kind": "photo", "uri": f"file:///srv/{USER_ID}/a.jpg", "caption": USER_NAME}],
        metadata={"user_id": USER_ID, "user_name": USER_NAME},
    )
    ledger.mark_attempting(delivered)
    ledger.mark_delivered(delivered, [RECEIPT])
    failed = ledger.record_obligation(
        obligation_id="o-failed",
        session_key=SESSION_KEY,
        platform="telegram",
        chat_id=CHAT_ID,
        content=SECOND_TEXT,
    )
    ledger.mark_attempting(failed)
    ledger.mark_failed(failed, ERROR_TEXT, "ambiguous")
    pending = ledger.record_obligation(
        obligation_id="o-pending",
        session_key=SESSION_KEY,
        platform="telegram",
        chat_id=CHAT_ID,
        content=TEXT + " (again)",
    )
    ledger.record_obligation(
        obligation_id="o-other",
        session_key=OTHER_KEY,
        platform="telegram",
        chat_id="c-someone-else",
        content=OTHER_TEXT,
    )
    return [delivered, failed, pending]


def test_no_personal_data_in_clear_at_rest(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    record_known(ledger)
    # The API still hands back clear text, in this process and in a fresh one.
    assert ledger.get("o-delivered").content == TEXT
    again = DeliveryLedger.open(store_location)
    status = again.get("o-delivered")
    assert (status.chat_id, status.thread_id, status.reply_to) == (CHAT_ID, THREAD_ID, REPLY_TO)
    assert status.metadata == {"user_id": USER_ID, "user_name": USER_NAME}
    assert status.media[0].caption == USER_NAME
    assert status.receipt == (RECEIPT,)
    assert status.session_key == SESSION_KEY
    assert again.get("o-failed").last_error == ERROR_TEXT
    raw = store_bytes(store_location, again)
    assert b"o-delivered" in raw  # the scan does see the store's content
    for secret in SECRETS:
        assert secret.encode() not in raw, f"{secret!r} found in clear at rest"
    # Non-personal facts stay readable without any key: the audit columns.
    assert b'"platform":"telegram"' in raw
    assert b'"classification":"ambiguous"' in raw


def test_encrypt_false_stores_clear_and_is_still_readable(store_location: str) -> None:
    clear = DeliveryLedger.open(store_location, encrypt=False)
    clear.record_obligation(
        obligation_id="o-clear",
        session_key=OTHER_KEY,
        platform="x",
        chat_id="c1",
        content=OTHER_TEXT,
    )
    sealed = DeliveryLedger.open(store_location)
    sealed.record_obligation(
        obligation_id="o-sealed", session_key=SESSION_KEY, platform="x", chat_id="c1", content=TEXT
    )
    assert clear.get("o-sealed").content == TEXT  # reading always opens sealed events
    assert sealed.get("o-clear").content == OTHER_TEXT
    raw = store_bytes(store_location, sealed)
    assert OTHER_TEXT.encode() in raw  # encrypt=False: stored as upstream would
    assert TEXT.encode() not in raw


def test_forget_session_erases_but_history_replays(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    ids = record_known(ledger)
    keyring = ledger.private_mapper.keyring
    subject = keyring.subject_id(SESSION_KEY)
    (key_row,) = [row for row in keyring.table.rows() if row[1] == subject]
    wrapped = key_row[2]
    assert wrapped in store_bytes(store_location, DeliveryLedger.open(store_location))

    report = ledger.forget_session(SESSION_KEY, requested_by="operator-7")

    assert report.subject_id == subject
    assert report.destroyed_keys == (key_row[0],)
    assert sorted(report.abandoned) == ["o-failed", "o-pending"]
    fresh = DeliveryLedger.open(store_location)
    for oid in ids:
        status = fresh.get(oid)
        assert status.content == ERASED
        assert status.chat_id == ERASED
        assert status.session_key == ERASED
        assert status.metadata == {} and status.media == () and status.parts == ()
        history = [e.to_dict() for e in fresh.history(oid)]
        assert history[0]["type"] == "Recorded"
        assert history[0]["fields"]["content"] == ERASED
        assert history[0]["fields"]["target"]["platform"] == "telegram"
    delivered = fresh.get("o-delivered")
    assert (delivered.state, delivered.receipt, delivered.send_attempts) == ("delivered", (), 1)
    assert fresh.get("o-failed").last_error == ERASED
    assert fresh.get("o-failed").error_class == "ambiguous"  # the audit facts survive
    for oid in ("o-failed", "o-pending"):
        status = fresh.get(oid)
        assert (status.state, status.abandon_reason) == ("abandoned", "erased")
    other = fresh.get("o-other")
    assert (other.content, other.state) == (OTHER_TEXT, "pending")  # other subjects untouched
    # The erasure itself is on record: who and when, and no personal data.
    (erasure,) = erasures(fresh)
    assert erasure.subject_id == subject and erasure.requested_by == "operator-7"
    assert erasure.by == ledger.owner and erasure.destroyed_keys == [key_row[0]]
    assert sorted(erasure.abandoned) == ["o-failed", "o-pending"]

    raw = store_bytes(store_location, fresh)
    for secret in SECRETS:
        assert secret.encode() not in raw
    # The wrapped key is nowhere in the store any more (on SQLite: nor in the WAL or free pages).
    assert wrapped not in raw
    assert all(row[1] != subject for row in keyring.table.rows())
    if not store_location.startswith("postgresql://"):
        assert report.wal_truncated is True


def test_erased_data_cannot_be_recovered_even_with_the_master_key(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    record_known(ledger)
    sealed_before = _sealed_blobs(ledger)
    ledger.forget_session(SESSION_KEY)
    master = load_master_key(store_location)  # the attacker holds the master key
    wrap = AESGCM(derive(master, "gateway-ledger/wrap-data-keys/v1"))
    fresh = DeliveryLedger.open(store_location)
    keys = []
    for key_id, subject_id, wrapped in fresh.private_mapper.keyring.table.rows():
        aad = f"gateway-ledger/data-key/v1|{key_id}|{subject_id}".encode()
        keys.append(AESGCM(wrap.decrypt(wrapped[:12], wrapped[12:], aad)))
    assert keys, "the other subject's key must still be there"
    subject = fresh.private_mapper.keyring.subject_id(SESSION_KEY)
    erased_blobs = [b for s, b in sealed_before if s == subject]
    assert len(erased_blobs) >= 5
    for blob in erased_blobs:
        for aead in keys:
            with pytest.raises(InvalidTag):
                # Even ignoring the AAD binding, no remaining key opens the ciphertext.
                aead.decrypt(blob[:12], blob[12:], None)
    # The other subject still opens with its key, so the attempt above was a real one.
    assert fresh.get("o-other").content == OTHER_TEXT


def _sealed_blobs(ledger: DeliveryLedger) -> list[tuple[str, bytes]]:
    blobs = []
    for n in ledger.recorder.select_notifications(None, 1000):
        envelope = orjson.loads(n.state).get("_sealed_")
        if envelope and "c" in envelope:
            blobs.append((envelope["s"], base64.b64decode(envelope["c"])))
    return blobs


def test_unresolved_obligation_of_erased_subject_is_never_sent(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    ledger.record_obligation(
        obligation_id="o-owed", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content=TEXT
    )
    ledger.forget_session(SESSION_KEY)
    fresh = DeliveryLedger.open(store_location)
    status = fresh.get("o-owed")
    assert (status.state, status.abandon_reason) == ("abandoned", "erased")
    assert fresh.is_erased("o-owed")
    with pytest.raises(LedgerError):
        ledger.mark_attempting("o-owed")


def test_session_used_again_after_erasure_gets_a_new_key(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content=TEXT
    )
    first = ledger.forget_session(SESSION_KEY)
    ledger.record_obligation(
        obligation_id="o-2", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content="new"
    )
    fresh = DeliveryLedger.open(store_location)
    assert fresh.get("o-2").content == "new"
    assert fresh.is_erased("o-1") and not fresh.is_erased("o-2")
    assert fresh.get("o-1").content == ERASED
    second = fresh.forget_session(SESSION_KEY)
    assert second.destroyed_keys and second.destroyed_keys != first.destroyed_keys
    assert len(erasures(fresh)) == 2
    assert fresh.forget_session(SESSION_KEY).destroyed_keys == ()  # idempotent


def test_wrong_master_key_is_refused(store_location: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = DeliveryLedger.open(store_location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content=TEXT
    )
    monkeypatch.setenv(MASTER_KEY_ENV, base64.b64encode(os.urandom(32)).decode())
    with pytest.raises(MasterKeyMismatch):
        DeliveryLedger.open(store_location).get("o-1")


def test_master_key_file_is_private_and_env_is_validated(
    sqlite_location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = DeliveryLedger.open(sqlite_location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content=TEXT
    )
    key_file = Path(sqlite_location + ".key")
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    env_key = key_file.read_text().strip()
    monkeypatch.setenv(MASTER_KEY_ENV, env_key)  # the same key from the environment works
    assert DeliveryLedger.open(sqlite_location).get("o-1").content == TEXT
    monkeypatch.setenv(MASTER_KEY_ENV, "not base64!")
    with pytest.raises(InvalidInput):
        DeliveryLedger.open(sqlite_location).get("o-1")


def test_logs_carry_no_personal_data(store_location: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="gateway_ledger")
    ledger = DeliveryLedger.open(store_location)
    record_known(ledger)
    ledger.forget_session(SESSION_KEY)
    text = caplog.text
    assert "erased" in text
    for secret in [*SECRETS, SESSION_KEY]:
        assert secret not in text


def test_cli_sessions_forget(sqlite_location: str) -> None:
    ledger = DeliveryLedger.open(sqlite_location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id=CHAT_ID, content=TEXT
    )
    ledger.close()
    exe = Path(sys.executable).with_name("gateway-ledger")
    done = subprocess.run(
        [str(exe), "sessions", "forget", SESSION_KEY, "--db", sqlite_location, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = orjson.loads(done.stdout)
    assert out["abandoned"] == ["o-1"] and len(out["destroyed_keys"]) == 1
    assert SESSION_KEY not in done.stdout and CHAT_ID not in done.stdout
    assert DeliveryLedger.open(sqlite_location).get("o-1").content == ERASED
    assert forget_session(sqlite_location, SESSION_KEY).destroyed_keys == ()
