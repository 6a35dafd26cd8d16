"""SessionStore on every store: resolve, append, history, dedupe, resets, restarts, races."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway_ledger.application.sessions.admin import list_sessions
from gateway_ledger.application.sessions.store import SessionsApplication
from gateway_ledger.application.sessions.views import TranscriptMessage
from gateway_ledger.bootstrap import SessionStore
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput, NotFound
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.policy import ResetPolicies, ResetPolicy
from gateway_ledger.domain.sessions.route import SessionKeying
from gateway_ledger.domain.sessions.session import session_uuid
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.eventstore.store import store_environment
from gateway_ledger.infrastructure.sessions.secrets import load_or_create_secret, secret_path

T0 = datetime(2026, 7, 20, 10, 0, tzinfo=UTC)
ALICE = SessionSource(platform="telegram", chat_id="99", user_id="4242", user_name="alice")


@pytest.fixture
def secret_dir(tmp_path: Path) -> Path:
    return tmp_path / "secrets"


def open_store(location: str, secret_dir: Path, **kw: object) -> SessionStore:
    return SessionStore.open(location, secret_dir=secret_dir, **kw)  # type: ignore[arg-type]


def test_resolve_append_history_round_trip(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE, T0)
    assert ctx.is_new and not ctx.auto_reset and ctx.message_count == 0
    parts = ctx.key.split(":")
    assert "99" not in parts and "4242" not in parts  # keyed hashes by default
    assert ctx.key.startswith("agent:main:telegram:dm:")
    store.append(ctx, "user", "hello", "m1", now=T0)
    store.append(ctx, "assistant", "hi alice", now=T0 + timedelta(seconds=1))
    again = store.resolve(ALICE, T0 + timedelta(minutes=1))
    assert again.session_id == ctx.session_id and not again.is_new and again.message_count == 2
    history = store.history(ctx.session_id)
    assert [(m.seq, m.role, m.content, m.platform_message_id) for m in history] == [
        (1, "user", "hello", "m1"),
        (2, "assistant", "hi alice", None),
    ]
    assert [m.content for m in store.history(ctx.session_id, last=1)] == ["hi alice"]
    assert store.history(ctx.session_id, last=0) == []
    with pytest.raises(NotFound):
        store.history("20260101_000000_00000000")


def test_history_last_n_skips_non_message_events(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE, T0)
    for i in range(30):
        store.append(ctx, "user", f"m{i}", now=T0)
        if i % 3 == 0:
            store.mark_resume_pending(ctx.session_id, now=T0)
            store.clear_resume_pending(ctx.session_id, now=T0)
    assert [m.content for m in store.history(ctx.session_id, last=12)] == [
        f"m{i}" for i in range(18, 30)
    ]
    assert len(store.history(ctx.session_id, last=500)) == 30


def test_raw_keys_compat_and_keying_is_checked(store_location: str, secret_dir: Path) -> None:
    raw = open_store(store_location, secret_dir, raw_keys=True)
    assert raw.resolve(ALICE, T0).key == "agent:main:telegram:dm:99"
    with pytest.raises(InvalidInput, match="raw upstream keys"):
        open_store(store_location, secret_dir)


def test_swapped_secret_is_refused(store_location: str, secret_dir: Path, tmp_path: Path) -> None:
    open_store(store_location, secret_dir).resolve(ALICE, T0)
    with pytest.raises(InvalidInput, match="another secret"):
        open_store(store_location, tmp_path / "other-secrets")


def test_secret_file_is_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    SessionStore.open(db)
    secret = tmp_path / "sessions.db.session-secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before = secret.read_bytes()
    SessionStore.open(db)
    assert secret.read_bytes() == before
    secret.chmod(0o644)
    with pytest.raises(InvalidInput, match="chmod 600"):
        SessionStore.open(db)


def test_trust_flags_never_reach_the_store(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir)
    trusted = SessionSource(
        platform="discord", chat_id="c", role_authorized=True, delivered_via_upstream_relay=True
    )
    ctx = store.resolve(trusted, T0)
    store.append(ctx, "user", "x", now=T0)
    stored = store.load_session(ctx.session_id).source
    assert stored == trusted and not stored.role_authorized
    assert not stored.delivered_via_upstream_relay
    blobs = b"".join(n.state for n in store.recorder.select_notifications(start=1, limit=100))
    assert b"role_authorized" not in blobs and b"upstream_relay" not in blobs


def test_inbound_dedupe_survives_reopen(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE, T0)
    first = store.append(ctx, "user", "hello", "101", now=T0)
    assert not first.duplicate and store.seen(ALICE, "101")
    assert not store.seen(ALICE, "102")
    other_chat = SessionSource(platform="telegram", chat_id="100", user_id="5")
    assert not store.seen(other_chat, "101")  # Telegram ids are per chat
    reopened = open_store(store_location, secret_dir)
    assert reopened.seen("telegram", "101", chat_id="99")
    dup = reopened.append(reopened.resolve(ALICE, T0), "user", "hello", "101", now=T0)
    assert dup.duplicate and (dup.session_id, dup.seq) == (first.session_id, first.seq)
    assert len(reopened.history(ctx.session_id)) == 1
    with pytest.raises(InvalidInput):
        reopened.seen("telegram", "101")


def test_idle_reset_policy_and_precedence(store_location: str, secret_dir: Path) -> None:
    policies = ResetPolicies(
        by_platform={"telegram": ResetPolicy(mode="idle", idle_minutes=60)},
    )
    store = open_store(store_location, secret_dir, policies=policies, timezone="Europe/Madrid")
    ctx = store.resolve(ALICE, T0)
    store.append(ctx, "user", "a", now=T0)
    assert store.resolve(ALICE, T0 + timedelta(minutes=59)).session_id == ctx.session_id
    later = store.resolve(ALICE, T0 + timedelta(minutes=61))
    assert later.auto_reset and later.reset_reason == "idle"
    assert later.previous_session_id == ctx.session_id and later.session_id != ctx.session_id
    with pytest.raises(IllegalTransition):
        store.append(ctx, "user", "late", now=T0 + timedelta(minutes=62))
    discord = SessionSource(platform="discord", chat_id="d", chat_type="dm")
    d = store.resolve(discord, T0)
    assert store.resolve(discord, T0 + timedelta(days=30)).session_id == d.session_id


def test_daily_reset_in_configured_zone(store_location: str, secret_dir: Path) -> None:
    policies = ResetPolicies(default=ResetPolicy(mode="daily", at_hour=4))
    store = open_store(store_location, secret_dir, policies=policies, timezone="America/New_York")
    ctx = store.resolve(ALICE, datetime(2026, 3, 8, 7, 30, tzinfo=UTC))  # 03:30 EDT
    assert (
        store.resolve(ALICE, datetime(2026, 3, 8, 7, 59, tzinfo=UTC)).session_id == ctx.session_id
    )
    nxt = store.resolve(ALICE, datetime(2026, 3, 8, 8, 1, tzinfo=UTC))  # 04:01 EDT
    assert nxt.reset_reason == "daily"


def test_pinned_session_is_never_reset(store_location: str, secret_dir: Path) -> None:
    policies = ResetPolicies(default=ResetPolicy(mode="idle", idle_minutes=1))
    store = open_store(store_location, secret_dir, policies=policies)
    ctx = store.resolve(ALICE, T0)
    with store.pinned(ctx.key):
        assert store.resolve(ALICE, T0 + timedelta(hours=5)).session_id == ctx.session_id
        with pytest.raises(IllegalTransition, match="pinned"):
            store.reset(ctx.key)
    assert store.resolve(ALICE, T0 + timedelta(hours=5)).reset_reason == "idle"

    def broken(_: str) -> bool:
        raise RuntimeError("registry down")

    failing = open_store(store_location, secret_dir, policies=policies, has_active_processes=broken)
    current = failing.resolve(ALICE, T0 + timedelta(hours=5))
    assert failing.resolve(ALICE, T0 + timedelta(hours=9)).session_id == current.session_id


def test_manual_reset_and_suspend(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE, T0)
    new = store.reset(ctx.key, now=T0 + timedelta(seconds=1))
    assert new.session_id != ctx.session_id and new.reset_reason == "session_reset"
    assert not new.auto_reset
    assert store.resolve(ALICE, T0 + timedelta(seconds=2)).session_id == new.session_id
    store.suspend(new.session_id, now=T0 + timedelta(seconds=3))
    after = store.resolve(ALICE, T0 + timedelta(seconds=4))
    assert after.reset_reason == "suspended" and after.previous_session_id == new.session_id
    with pytest.raises(NotFound):
        store.reset("agent:main:telegram:dm:nobody")
    fresh = SessionSource(platform="telegram", chat_id="77")
    assert store.reset(fresh, now=T0).is_new  # /new in a chat never seen: just a new session


def test_auto_continue_window(store_location: str, secret_dir: Path) -> None:
    # The window applies only under a reset mode other than ``none`` (upstream), and counts
    # from the moment the resume was marked: the message at 300 s does not extend it.
    idle = ResetPolicies(default=ResetPolicy(mode="idle", idle_minutes=1440))
    store = open_store(store_location, secret_dir, auto_continue_seconds=600, policies=idle)
    ctx = store.resolve(ALICE, T0)
    store.append(ctx, "user", "long task", now=T0)
    store.mark_resume_pending(ctx.session_id, "restart", now=T0)
    fresh = store.resolve(ALICE, T0 + timedelta(seconds=300))
    assert fresh.session_id == ctx.session_id and fresh.should_auto_continue
    store.append(fresh, "user", "still there?", now=T0 + timedelta(seconds=300))
    fresh = store.resolve(ALICE, T0 + timedelta(seconds=599))
    assert fresh.session_id == ctx.session_id and fresh.should_auto_continue
    expired = store.resolve(ALICE, T0 + timedelta(seconds=601))
    assert expired.reset_reason == "resume_pending_expired" and not expired.should_auto_continue
    assert len(store.history(ctx.session_id)) == 2  # the old transcript is kept


def test_reset_mode_none_keeps_an_interrupted_conversation(
    store_location: str, secret_dir: Path
) -> None:
    store = open_store(store_location, secret_dir, auto_continue_seconds=600)  # mode none
    ctx = store.resolve(ALICE, T0)
    store.mark_resume_pending(ctx.session_id, "restart_timeout", now=T0)
    kept = store.resolve(ALICE, T0 + timedelta(days=3))
    assert kept.session_id == ctx.session_id and kept.should_auto_continue


def test_auto_continue_window_from_environment(
    store_location: str, secret_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_AUTO_CONTINUE_SECONDS", "0")
    store = open_store(store_location, secret_dir)
    assert store.auto_continue_seconds == 0
    ctx = store.resolve(ALICE, T0)
    store.mark_resume_pending(ctx.session_id, now=T0)
    kept = store.resolve(ALICE, T0 + timedelta(days=2))  # <= 0 disables the freshness gate
    assert kept.session_id == ctx.session_id and kept.should_auto_continue
    monkeypatch.setenv("GATEWAY_LEDGER_AUTO_CONTINUE_SECONDS", "120")
    assert open_store(store_location, secret_dir).auto_continue_seconds == 120
    assert (
        open_store(store_location, secret_dir, auto_continue_seconds=5).auto_continue_seconds == 5
    )


def test_export_transcript(store_location: str, secret_dir: Path, tmp_path: Path) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE, T0)
    store.append(ctx, "user", "héllo\nworld", "m1", now=T0)
    store.append(ctx, "assistant", "ok", now=T0)
    path = store.export_transcript(ctx.session_id, tmp_path / "out")
    assert path == tmp_path / "out" / f"{ctx.session_id}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["seq"], x["role"], x["content"]) for x in lines] == [
        (1, "user", "héllo\nworld"),
        (2, "assistant", "ok"),
    ]
    for bad in ("../escape", "a/b", "C:evil", "..", ""):
        with pytest.raises(InvalidInput):
            store.export_transcript(bad, tmp_path / "out")
    assert not (tmp_path / "escape.jsonl").exists()


def test_route_of_and_load_session_read_the_current_state(
    store_location: str, secret_dir: Path
) -> None:
    store = open_store(store_location, secret_dir)
    assert store.route_of("agent:main:telegram:dm:nobody") is None
    ctx = store.resolve(ALICE, T0)
    store.append(ctx, "user", "hello", now=T0)
    route = store.route_of(ctx.key)
    assert route is not None and (route.key, route.session_id) == (ctx.key, ctx.session_id)
    session = store.load_session(ctx.session_id)
    assert (session.session_id, session.message_count, session.source) == (
        ctx.session_id,
        1,
        ALICE,
    )
    nxt = store.reset(ctx.key, now=T0 + timedelta(seconds=1))
    route = store.route_of(ctx.key)
    assert route is not None and route.session_id == nxt.session_id and route.rotations == 1
    assert store.load_session(ctx.session_id).successor_session_id == nxt.session_id
    with pytest.raises(NotFound, match=r"no session with id '20260101_000000_00000000'"):
        store.load_session("20260101_000000_00000000")


def test_a_constructed_store_records_its_keying_only_when_it_first_makes_a_key(
    store_location: str, tmp_path: Path
) -> None:
    """The constructor makes no secret and writes no record; the first key checks."""
    keyed = KeyedHasher(b"k" * 32)
    store = SessionStore(store_environment(store_location), hasher=keyed)
    try:
        assert SessionKeying.create_id() not in store.repository
        assert store.resolve(ALICE, T0).is_new
        recorded = store.repository.get(SessionKeying.create_id())
        assert isinstance(recorded, SessionKeying) and recorded.mode == store.keying_mode
    finally:
        store.close()
    assert not [p for p in tmp_path.iterdir() if "secret" in p.name]
    other = SessionStore(store_environment(store_location), hasher=KeyedHasher(b"o" * 32))
    try:
        with pytest.raises(InvalidInput, match="another secret"):
            other.resolve(ALICE, T0)
        with pytest.raises(InvalidInput, match="another secret"):
            other.seen(ALICE, "101")
    finally:
        other.close()
    unchecked = SessionStore(store_environment(store_location), raw_keys=True, keying_check=False)
    try:
        assert unchecked.resolve(ALICE, T0).key == "agent:main:telegram:dm:99"
    finally:
        unchecked.close()


def test_the_stored_name_does_not_depend_on_the_class(store_location: str) -> None:
    """The library names an application after its class: its events' identity and, on
    PostgreSQL, its tables. Every class of the session store keeps ``gateway_sessions``."""

    class Renamed(SessionStore):
        pass

    assert SessionsApplication.name == SessionStore.name == Renamed.name == "gateway_sessions"
    store = Renamed(store_environment(store_location), raw_keys=True)
    try:
        store.resolve(ALICE, T0)
    finally:
        store.close()
    reopened = open_store(store_location, Path("unused"), raw_keys=True)
    assert [s.session_id for s in list_sessions(reopened)] != []


def test_export_hands_the_messages_to_the_transcript_writer(
    store_location: str, secret_dir: Path, tmp_path: Path
) -> None:
    """The application reads the transcript; writing the file is the writer's (a port)."""
    written: list[tuple[Path, str, list[TranscriptMessage]]] = []

    class Recording:
        def write_transcript(
            self, directory: Path, session_id: str, messages: Iterable[TranscriptMessage]
        ) -> Path:
            written.append((directory, session_id, list(messages)))
            return directory / "somewhere"

    class Recorded(SessionStore):
        transcript_writer = Recording()

    open_store(store_location, secret_dir)  # the secret, and the keying record
    hasher = KeyedHasher(load_or_create_secret(secret_path(store_location, secret_dir)))
    store = Recorded(store_environment(store_location), hasher=hasher)
    ctx = store.resolve(ALICE, T0)
    store.append(ctx, "user", "one", now=T0)
    store.append(ctx, "assistant", "two", now=T0)
    out = tmp_path / "out"
    assert store.export_transcript(ctx.session_id, str(out)) == out / "somewhere"
    assert written == [(out, ctx.session_id, store.history(ctx.session_id))]
    assert [m.content for m in written[0][2]] == ["one", "two"]
    assert not out.exists()  # nothing but the writer writes
    with pytest.raises(NotFound):
        store.export_transcript("20260101_000000_00000000", out)
    assert len(written) == 1


def test_google_chat_sessions_survive_in_raw_mode(store_location: str, secret_dir: Path) -> None:
    store = open_store(store_location, secret_dir, raw_keys=True)
    src = SessionSource(
        platform="google_chat",
        chat_id="spaces/AAA",
        chat_type="group",
        thread_id="spaces/AAA/threads/BBB",
    )
    ctx = store.resolve(src, T0)
    assert ctx.key == "agent:main:google_chat:group:spaces/AAA:spaces/AAA/threads/BBB"
    store.append(ctx, "user", "hi", now=T0)
    again = open_store(store_location, secret_dir, raw_keys=True).resolve(src, T0)
    assert again.session_id == ctx.session_id
    with pytest.raises(InvalidInput, match="traversal"):
        store.resolve(SessionSource(platform="x", chat_id="../../etc"), T0)


# -- real processes ----------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import datetime, UTC
    from gateway_ledger.bootstrap import SessionStore
    from gateway_ledger.domain.sessions.source import SessionSource

    location, secret_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    store = SessionStore.open(location, secret_dir=secret_dir)
    if mode == "crash":
        src = SessionSource(platform="telegram", chat_id="99", user_id="4242")
        ctx = store.resolve(src)
        store.append(ctx, "assistant", "answer to question 1", "out-1")
        store.append(ctx, "user", "question 2", "in-2")
        store.mark_resume_pending(ctx.session_id, "restart")
        print(ctx.session_id, flush=True)
        os.kill(os.getpid(), 9)
    if mode == "continue":
        src = SessionSource(platform="telegram", chat_id="99", user_id="4242")
        ctx = store.resolve(src)
        history = [m.content for m in store.history(ctx.session_id)]
        store.append(ctx, "assistant", "answer to question 2")
        store.clear_resume_pending(ctx.session_id)
        print(json.dumps({"session_id": ctx.session_id, "history": history,
                          "auto_continue": ctx.should_auto_continue,
                          "seen": store.seen(src, "in-2")}))
    if mode == "race":
        go = sys.argv[4]
        while not os.path.exists(go):
            time.sleep(0.001)
        out = {}
        for i in range(int(sys.argv[5])):
            src = SessionSource(platform="discord", chat_id=f"new-{i}", chat_type="dm")
            out[str(i)] = store.resolve(src).session_id
        print(json.dumps(out))
    """
)


def run_child(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=timeout
    )


def test_restart_in_a_second_process_continues_with_full_history(
    store_location: str, secret_dir: Path
) -> None:
    store = open_store(store_location, secret_dir)
    ctx = store.resolve(ALICE)
    store.append(ctx, "user", "question 1", "in-1")

    crashed = run_child(store_location, str(secret_dir), "crash")
    assert crashed.returncode == -9, crashed.stderr
    assert crashed.stdout.strip() == ctx.session_id

    cont = run_child(store_location, str(secret_dir), "continue")
    assert cont.returncode == 0, cont.stderr
    result = json.loads(cont.stdout)
    assert result == {
        "session_id": ctx.session_id,
        "history": ["question 1", "answer to question 1", "question 2"],
        "auto_continue": True,
        "seen": True,
    }
    assert [m.content for m in open_store(store_location, secret_dir).history(ctx.session_id)][
        -1
    ] == "answer to question 2"


def test_two_processes_resolving_new_sources_end_in_one_session_each(
    store_location: str, secret_dir: Path, tmp_path: Path
) -> None:
    open_store(store_location, secret_dir)  # create tables and the secret up front
    go = tmp_path / "go"
    n = 15
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, store_location, str(secret_dir), "race", str(go), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1]
    store = open_store(store_location, secret_dir)
    topics = [n.topic for n in store.recorder.select_notifications(start=1, limit=10_000)]
    started = [t for t in topics if t.endswith("Session.Started")]
    opened = [t for t in topics if t.endswith("SessionRoute.Opened")]
    assert len(started) == len(opened) == n  # no orphan session from the losing process


def test_an_append_after_another_writer_lands_after_its_message(
    store_location: str, secret_dir: Path
) -> None:
    """``resolve`` keeps the session it read for the ``append`` that follows (one read
    instead of two). Another writer (a second store on the same location, as another
    process) appends in between: the kept copy is then behind the store, its write fails
    on the version, and the append is made on the session as stored: nothing lost, no
    sequence number taken twice."""
    first = open_store(store_location, secret_dir)
    other = open_store(store_location, secret_dir)
    try:
        ctx = first.resolve(ALICE, T0)
        first.append(ctx, "user", "one", now=T0)
        ctx = first.resolve(ALICE, T0 + timedelta(seconds=1))  # kept again for its append
        uuid = session_uuid(ctx.session_id)
        kept = first.kept.take(uuid)
        assert kept is not None and kept.version == 2  # Started, one message
        first.kept.keep(kept)
        theirs = other.resolve(ALICE, T0 + timedelta(seconds=2))
        assert theirs.session_id == ctx.session_id
        assert other.append(theirs, "assistant", "two", now=T0 + timedelta(seconds=2)).seq == 2
        assert first.append(ctx, "user", "three", now=T0 + timedelta(seconds=3)).seq == 3
        assert [(m.seq, m.content) for m in first.history(ctx.session_id)] == [
            (1, "one"),
            (2, "two"),
            (3, "three"),
        ]
        again = first.kept.take(uuid)  # the copy the last append wrote, current
        assert again is not None and again.version == 4
    finally:
        first.close()
        other.close()


def test_an_append_refused_on_a_kept_copy_is_decided_on_the_session_as_stored(
    store_location: str, secret_dir: Path
) -> None:
    """A kept copy that refuses the append (it shows the session ended) does not decide:
    another writer switched back to the session meanwhile, reopening it, and the append
    is made on the session as stored."""
    first = open_store(store_location, secret_dir)
    other = open_store(store_location, secret_dir)
    try:
        ctx = first.resolve(ALICE, T0)
        first.append(ctx, "user", "one", now=T0)
        first.reset(ctx.key, now=T0 + timedelta(seconds=1))  # ends it: the key moves on
        ended = first.load_session(ctx.session_id)
        assert ended.ended
        first.kept.keep(ended)  # what this process last saw of it
        assert other.switch_session(ctx.key, ctx.session_id, now=T0 + timedelta(seconds=2))
        result = first.append(ctx, "assistant", "two", now=T0 + timedelta(seconds=3))
        assert (result.session_id, result.seq) == (ctx.session_id, 2)
        assert [m.content for m in first.history(ctx.session_id)] == ["one", "two"]
    finally:
        first.close()
        other.close()
