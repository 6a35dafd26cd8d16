"""Secret and store files: created private, adopted only when they are ours and private.

A master key or session secret that another local user could read, or could have planted
before the store existed, would give away (or hand over) every sealed field. A key that
is missing beside a sealed store must stop every command before anything is created: a
new key cannot open the old data, and leaving it behind only hides the real problem.
These run as root here, so "another owner" is a chown to an unprivileged uid.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.errors import InvalidInput, LedgerError
from gateway_ledger.domain.sessions.key import SessionSource
from gateway_ledger.infrastructure.privacy.master_key import MASTER_KEY_ENV
from gateway_ledger.infrastructure.sessions.secrets import load_or_create_secret

EXE = str(Path(sys.executable).parent / "gateway-ledger")
OTHER_UID = 65534
SESSION_KEY = "agent:main:telegram:dm:c-4242"


@pytest.fixture(autouse=True)
def private_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_KEY_FILE", raising=False)
    monkeypatch.delenv("GATEWAY_LEDGER_SECRET_DIR", raising=False)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The loosest umask: files are private because we made them so, not by luck."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def key_file_of(location: str) -> Path:
    if location.startswith("postgresql://"):
        return Path(os.environ["GATEWAY_LEDGER_KEY_DIR"]) / "master.key"
    return Path(location + ".key")


def sealed_store(location: str) -> None:
    """A store with one sealed obligation, closed (its WAL checkpointed away)."""
    ledger = DeliveryLedger.open(location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="hi"
    )
    ledger.get("o-1")
    ledger.stats()  # the views are caught up: a later read has nothing to write
    ledger.close()


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in done.stderr


def plant_key(path: Path, mode: int = 0o600, uid: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, -1)


# -- a key file others can read, or did not create ---------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_master_key_file_readable_by_others_is_refused(sqlite_location: str, mode: int) -> None:
    sealed_store(sqlite_location)
    key = key_file_of(sqlite_location)
    key.chmod(mode)
    with pytest.raises(InvalidInput, match="chmod 600"):
        DeliveryLedger.open(sqlite_location).get("o-1")
    assert stat.S_IMODE(key.stat().st_mode) == mode  # refused, not silently "repaired"


def test_master_key_planted_by_another_user_is_not_adopted(store_location: str) -> None:
    key = key_file_of(store_location)
    plant_key(key, 0o600, uid=OTHER_UID)
    planted = key.read_bytes()
    with pytest.raises(InvalidInput, match="not owned by"):
        ledger = DeliveryLedger.open(store_location)
        ledger.record_obligation(
            obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
        )
    assert key.read_bytes() == planted
    key.unlink()
    ledger = DeliveryLedger.open(store_location)
    assert not ledger.exists("o-1")  # nothing was sealed with the planted key
    ledger.close()


def test_master_key_planted_with_open_mode_is_not_adopted(sqlite_location: str) -> None:
    key = key_file_of(sqlite_location)
    plant_key(key, 0o644)
    with pytest.raises(InvalidInput, match="chmod 600"):
        ledger = DeliveryLedger.open(sqlite_location)
        ledger.record_obligation(
            obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
        )


def test_session_secret_of_another_user_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "s.session-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    os.chown(secret, OTHER_UID, -1)
    with pytest.raises(InvalidInput, match="not owned by"):
        load_or_create_secret(secret)
    with pytest.raises(InvalidInput, match="not owned by"):
        SessionStore.open(str(tmp_path / "s"))


def test_new_key_and_secret_files_are_private_and_their_directory_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None
) -> None:
    """A power loss after the first sealed write must not keep the data and lose the key:
    the new key's directory entry is flushed (fsync of the directory) before it is used."""
    synced_dirs: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            synced_dirs.append(info.st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    keys = tmp_path / "keydir"
    monkeypatch.setenv("GATEWAY_LEDGER_KEY_FILE", str(keys / "master.key"))
    location = str(tmp_path / "store" / "ledger.db")
    ledger = DeliveryLedger.open(location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
    )
    ledger.close()
    key = keys / "master.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.stat().st_uid == os.geteuid()
    assert keys.stat().st_ino in synced_dirs
    assert [p.name for p in keys.iterdir()] == ["master.key"]  # no temporary left behind
    secret = tmp_path / "secrets" / "x.session-secret"
    load_or_create_secret(secret)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.parent.stat().st_ino in synced_dirs


# -- a missing key beside a sealed store --------------------------------------------------------


def test_missing_master_key_beside_a_sealed_store_is_refused_and_nothing_created(
    store_location: str,
) -> None:
    sealed_store(store_location)
    key = key_file_of(store_location)
    key.unlink()
    before = None if store_location.startswith("postgresql://") else digest(store_location)
    with pytest.raises(LedgerError, match="master key missing"):
        DeliveryLedger.open(store_location)
    assert not key.exists()
    if before is not None:
        assert digest(store_location) == before
        assert not Path(store_location + "-wal").exists()


def test_missing_master_key_for_writes_too(sqlite_location: str) -> None:
    """Not only reads: a write on a sealed store never seals with a fresh, wrong key."""
    sealed_store(sqlite_location)
    key_file_of(sqlite_location).unlink()
    with pytest.raises(LedgerError, match="master key missing"):
        DeliveryLedger.open(sqlite_location).record_obligation(
            obligation_id="o-2", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
        )
    with pytest.raises(LedgerError, match="master key missing"):
        SessionStore.open(sqlite_location, raw_keys=True)
    assert not key_file_of(sqlite_location).exists()


def test_a_store_never_sealed_still_gets_its_key_on_first_use(sqlite_location: str) -> None:
    clear = DeliveryLedger.open(sqlite_location, encrypt=False)
    clear.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
    )
    clear.close()
    assert not key_file_of(sqlite_location).exists()
    sealed = DeliveryLedger.open(sqlite_location)
    sealed.record_obligation(
        obligation_id="o-2", session_key=SESSION_KEY, platform="x", chat_id="c1", content="y"
    )
    assert sealed.get("o-2").content == "y"
    sealed.close()
    assert stat.S_IMODE(key_file_of(sqlite_location).stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "command", [["status"], ["list"], ["history", "o-1"], ["metrics"], ["audit", "duplicates"]]
)
def test_cli_missing_master_key_exits_2_and_creates_nothing(
    sqlite_location: str, command: list[str]
) -> None:
    sealed_store(sqlite_location)
    key = key_file_of(sqlite_location)
    key.unlink()
    before = digest(sqlite_location)
    done = run_cli(*command, "--db", sqlite_location)
    if "invalid choice" in done.stderr:
        pytest.fail(f"no such command: {command}")
    assert_one_line_exit_2(done, "master key missing")
    assert not key.exists()
    assert digest(sqlite_location) == before
    assert sorted(p.name for p in Path(sqlite_location).parent.iterdir()) == [
        "ledger.db",
        "ledger.db.installation-id",
    ]


# -- malformed keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00binary\x81",
        b"not base64 at all!\n",
        base64.b64encode(b"short") + b"\n",
        b"",
    ],
    ids=["binary", "not-base64", "short", "empty"],
)
def test_malformed_key_file_is_a_typed_error_and_one_cli_line(
    sqlite_location: str, content: bytes
) -> None:
    sealed_store(sqlite_location)
    key = key_file_of(sqlite_location)
    key.write_bytes(content)
    with pytest.raises(InvalidInput, match="master key"):
        DeliveryLedger.open(sqlite_location).get("o-1")
    assert_one_line_exit_2(run_cli("status", "--db", sqlite_location), "master key")
    assert key.read_bytes() == content


@pytest.mark.parametrize(
    "value", ["not base64!", base64.b64encode(b"short").decode(), "\udcff\udcfe"]
)
def test_malformed_master_key_variable_is_a_typed_error_and_one_cli_line(
    sqlite_location: str, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    sealed_store(sqlite_location)
    monkeypatch.setenv(MASTER_KEY_ENV, value)
    with pytest.raises(InvalidInput, match=MASTER_KEY_ENV):
        DeliveryLedger.open(sqlite_location).get("o-1")
    env = {k: v for k, v in os.environ.items() if k != MASTER_KEY_ENV}
    done = subprocess.run(
        [EXE, "status", "--db", sqlite_location],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, MASTER_KEY_ENV: value},
    )
    assert_one_line_exit_2(done, MASTER_KEY_ENV)


# -- store files and transcripts ------------------------------------------------------------------


def test_store_files_are_created_private_whatever_the_umask(
    tmp_path: Path, open_umask: None
) -> None:
    location = str(tmp_path / "ledger.db")
    ledger = DeliveryLedger.open(location)
    ledger.record_obligation(
        obligation_id="o-1", session_key=SESSION_KEY, platform="x", chat_id="c1", content="x"
    )
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    ledger.close()
    assert {"ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db.key"} <= set(files)
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db.key"):
        assert files[name] == 0o600, (name, oct(files[name]))
    sessions = tmp_path / "sessions.db"
    store = SessionStore.open(str(sessions))
    store.resolve(SessionSource(platform="telegram", chat_id="7"))
    assert stat.S_IMODE(sessions.stat().st_mode) == 0o600
    store.close()


def test_an_existing_store_keeps_its_mode(tmp_path: Path, open_umask: None) -> None:
    location = tmp_path / "ledger.db"
    sealed_store(str(location))
    location.chmod(0o640)  # the operator's choice (a backup group): not ours to change
    DeliveryLedger.open(str(location)).close()
    assert stat.S_IMODE(location.stat().st_mode) == 0o640


def exported_session(location: str) -> tuple[SessionStore, str]:
    store = SessionStore.open(location)
    ctx = store.resolve(SessionSource(platform="telegram", chat_id="7"))
    store.append(ctx, "user", "hello")
    return store, ctx.session_id


def test_export_transcript_does_not_follow_a_planted_symlink(
    tmp_path: Path, open_umask: None
) -> None:
    store, session_id = exported_session(str(tmp_path / "s.db"))
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # The temporary name used to be predictable (<id>.<pid>.tmp): plant it as a symlink.
    (out / f".{session_id}.{os.getpid()}.tmp").symlink_to(victim)
    path = store.export_transcript(session_id, out)
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert b"hello" in path.read_bytes()
    store.close()


def test_export_transcript_removes_its_temporary_file_on_error(tmp_path: Path) -> None:
    store, session_id = exported_session(str(tmp_path / "s.db"))
    out = tmp_path / "out"
    (out / f"{session_id}.jsonl").mkdir(parents=True)  # the target cannot be replaced
    with pytest.raises(OSError):
        store.export_transcript(session_id, out)
    assert [p.name for p in out.iterdir()] == [f"{session_id}.jsonl"]
    store.close()
