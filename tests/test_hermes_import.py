"""``gateway-ledger import hermes``: an installation in upstream's formats (tests/
hermes_fixture.py) migrated whole, read-only, idempotently, its bad files reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import attrs
import pytest

from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.entrypoints.hermes_import import import_hermes
from tests.hermes_fixture import (
    Installation,
    entry,
    naive,
    session_id,
    snapshot,
    source,
)

EXE = str(Path(sys.executable).parent / "gateway-ledger")
NOW = time.time()
T0 = NOW - 3 * 3600  # recent: nothing is stale for the sweep
DM = "agent:main:telegram:dm:99"
FORUM = "agent:main:telegram:forum:-1002285219667:17585"
STUCK = "agent:main:discord:group:guild-1:alice"
BROKEN = "agent:main:telegram:dm:broken"
ODD = "agent:main:telegram:dm:odd"
DM_ORIGIN = source("telegram", "99", user_id="4242", user_name="alice")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_DB"}
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120, env=env)


def build(home: Path) -> tuple[Installation, dict[str, str]]:
    """Five keys (one spoilt, one with a foreign id), six owed replies in every state."""
    inst = Installation(home)
    s1, s2 = session_id(T0, 1), session_id(T0 + 600, 2)
    inst.add_session(
        s1, DM, DM_ORIGIN, T0,
        [("user", "hello", T0 + 1, "m-1"), ("assistant", "hi alice", T0 + 2, None)],
        end_reason="idle",
    )  # fmt: skip
    inst.add_session(
        s2, DM, DM_ORIGIN, T0 + 600,
        [("user", "plan my week", T0 + 601, "m-2"), ("assistant", None, T0 + 602, None),
         ("tool", "\x00json:[{\"type\": \"text\"}]", T0 + 603, None)],
    )  # fmt: skip
    marked = T0 + 700
    inst.route(
        DM,
        entry(DM, s2, DM_ORIGIN, T0 + 600, T0 + 603, resume_pending=True,
              resume_reason="restart_timeout", last_resume_marked_at=naive(marked)),
    )  # fmt: skip
    # a forum topic known only to the legacy mirror, its transcript a legacy JSONL file
    forum_origin = source("telegram", "-1002285219667", chat_type="forum", thread_id="17585")
    s3 = session_id(T0, 3)
    (home / "sessions" / f"{s3}.jsonl").write_text(
        "\n".join(
            json.dumps(line, ensure_ascii=False)
            for line in (
                {"role": "session_meta", "tools": [], "model": "m", "platform": "telegram"},
                {
                    "role": "user",
                    "content": "topic question",
                    "timestamp": naive(T0 + 5),
                    "message_id": "77",
                },
                {"role": "assistant", "content": "topic answer", "timestamp": T0 + 6},
            )
        )
        + "\n"
    )
    inst.route(FORUM, entry(FORUM, s3, forum_origin, T0, T0 + 6), mirror_only=True)
    # three failed restarts: upstream suspends the key at its next boot
    stuck_origin = source("discord", "guild-1", chat_type="group", user_id="alice")
    s4 = session_id(T0, 4)
    inst.add_session(s4, STUCK, stuck_origin, T0, [("user", "loop", T0 + 1, None)])
    inst.route(STUCK, entry(STUCK, s4, stuck_origin, T0, T0 + 1))
    # a half-written legacy transcript, and a session id upstream would not make
    s5 = session_id(T0, 5)
    (home / "sessions" / f"{s5}.jsonl").write_text('{"role": "user", "content": "ok", "tim')
    broken_origin = source("telegram", "broken")
    inst.route(BROKEN, entry(BROKEN, s5, broken_origin, T0, T0), mirror_only=True)
    inst.route(ODD, entry(ODD, "../etc/passwd", source("telegram", "odd"), T0, T0))
    ids = {
        "delivered": inst.obligation(DM, "m-1", "hi alice", "delivered", T0 + 2, attempts=0),
        "abandoned": inst.obligation(DM, "m-0", "old", "abandoned", T0, attempts=3,
                                     last_error="Forbidden: bot was blocked"),
        "attempting": inst.obligation(DM, "m-2", "your week", "attempting", T0 + 604),
        "pending": inst.obligation(DM, "m-3", "never sent", "pending", T0 + 605),
        "claimed": inst.obligation(DM, "m-4", "claimed once", "pending", T0 + 606, attempts=1),
        "failed": inst.obligation(DM, "m-5", "timed out", "failed", T0 + 607,
                                  last_error="ReadTimeout"),
    }  # fmt: skip
    inst.commit()
    inst.write_files(failure_counts={STUCK: 3})
    return inst, ids


@pytest.fixture
def installation(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "hermes"
    inst, ids = build(home)
    inst.close()
    return home, ids


def test_the_fixture_installation_is_imported_whole(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, ids = installation
    db = str(tmp_path / "ledger.db")
    before = snapshot(home)
    report = import_hermes(home, db=db, raw_keys=True)
    assert snapshot(home) == before  # not one byte of the installation changed
    assert (report.keys_found, report.keys_imported) == (3, 3)
    assert (report.sessions_imported, report.messages_imported) == (4, 8)
    assert (report.obligations_found, report.obligations_imported) == (6, 6)
    assert "this machine's zone" in report.time_basis
    assert sorted((p.file, p.item) for p in report.problems) == [
        ("sessions/sessions.json", "key #5"),  # the half-written transcript
        ("state.db:gateway_routing", "key #3"),  # the unsafe session id
    ]
    assert "line 1" in next(p.error for p in report.problems if p.item == "key #5")

    store = SessionStore.open(db, raw_keys=True)
    try:
        status = store.status(DM)
        assert status is not None and status.session_id == session_id(T0 + 600, 2)
        assert (status.resume_pending, status.resume_reason) == (True, "restart_timeout")
        assert status.resume_marked_at == datetime.fromtimestamp(T0 + 700, UTC)
        assert status.auto_reset_reason == "idle"  # why the earlier session ended
        earlier = store.history(session_id(T0, 1))
        assert [(m.role, m.content, m.platform_message_id) for m in earlier] == [
            ("user", "hello", "m-1"),
            ("assistant", "hi alice", None),
        ]
        assert earlier[0].timestamp == datetime.fromtimestamp(T0 + 1, UTC)  # original time
        current = store.history(status.session_id)
        assert [m.content for m in current] == ["plan my week", "", '[{"type": "text"}]']
        forum = store.history(session_id(T0, 3))
        assert [m.content for m in forum] == ["topic question", "topic answer"]
        assert forum[0].timestamp.timestamp() == pytest.approx(T0 + 5, abs=1e-3)  # local ISO
        stuck = store.status(STUCK)
        assert stuck is not None and stuck.suspended
        # an inbound message redelivered after the switch starts no second turn
        assert store.seen(SessionSource(platform="telegram", chat_id="99"), "m-2")
        # a live gateway carries on: the interrupted conversation is resumed (mode none)
        ctx = store.resolve(SessionSource.from_dict(DM_ORIGIN))
        assert ctx.session_id == status.session_id and ctx.should_auto_continue
    finally:
        store.close()

    ledger = DeliveryLedger.open(db)
    try:
        assert ledger.get(ids["delivered"]).state == "delivered"
        assert ledger.get(ids["abandoned"]).state == "abandoned"
        facts = [e.type for e in ledger.history(ids["failed"])]
        assert facts[:2] == ["Recorded", "Imported"] and facts[-1] == "Failed"
        won = {item["obligation_id"]: item for item in ledger.sweep_recoverable()}
        # every unresolved row of the dead gateway is recovered; the possibly sent with the marker
        assert set(won) == {ids["attempting"], ids["pending"], ids["claimed"], ids["failed"]}
        assert won[ids["attempting"]]["needs_marker"] and won[ids["failed"]]["needs_marker"]
        assert won[ids["claimed"]]["needs_marker"]  # upstream's claim left it pending
        assert not won[ids["pending"]]["needs_marker"]  # recorded, never attempted
        assert won[ids["pending"]]["session_key"] == DM
    finally:
        ledger.close()

    shown = cli("sessions", "show", DM, "--db", db, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [s["session_id"] for s in json.loads(shown.stdout)["sessions"]] == [
        session_id(T0 + 600, 2),
        session_id(T0, 1),
    ]
    history = cli("history", ids["failed"], "--db", db)
    assert history.returncode == 0 and "Imported" in history.stdout, history.stderr
    status_out = cli("status", "--db", db, "--json")
    assert status_out.returncode == 0, status_out.stderr
    audit = cli("audit", "duplicates", "--db", db, "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_a_second_run_imports_nothing_new_and_says_so(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, _ = installation
    db = str(tmp_path / "ledger.db")
    first = cli("import", "hermes", str(home), "--db", db, "--json", "--timezone", "Asia/Tokyo")
    assert first.returncode == 1, first.stderr  # problems were found (and reported)
    report = json.loads(first.stdout)
    assert report["keys_imported"] == 3 and report["obligations_imported"] == 6
    assert "Asia/Tokyo" in report["time_basis"] and report["keying"] == "keyed hashes"
    second = cli("import", "hermes", str(home), "--db", db)
    assert "nothing new to import" in second.stdout, second.stdout + second.stderr
    again = import_hermes(home, db=db)
    assert again.nothing_new and again.keys_already_present == 3
    assert again.obligations_already_present == 6
    store = SessionStore.open(db)
    try:
        from gateway_ledger.application.sessions.admin import list_sessions

        assert len(list_sessions(store)) == 4  # no duplicates
        key = store.session_key(SessionSource.from_dict(DM_ORIGIN))
        assert "99" not in key.split(":")  # keyed hashes from here on
        assert store.status(key) is not None
    finally:
        store.close()


def test_a_dry_run_writes_nothing(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, _ = installation
    db = str(tmp_path / "ledger.db")
    report = import_hermes(home, db=db, dry_run=True, raw_keys=True)
    assert report.keys_imported == 3 and report.obligations_imported == 6
    assert report.dry_run and not list(tmp_path.glob("ledger.db*"))  # not even created
    assert "would import 3 session key(s)" in report.summary()
    real = import_hermes(home, db=db, raw_keys=True)
    assert real.keys_imported == 3 and real.obligations_imported == 6


def test_what_sits_in_the_wal_of_a_running_gateway_is_imported(tmp_path: Path) -> None:
    """The old gateway is still running: its last commits are in the WAL, not yet in the
    database file. The import reads them, and neither checkpoints nor changes any byte."""
    home = tmp_path / "hermes"
    inst, _ = build(home)
    inst.conn.execute("PRAGMA wal_autocheckpoint=0")
    late = inst.obligation(DM, "m-9", "written just now", "attempting", NOW - 5)
    inst.commit()  # committed: in the WAL only
    assert (home / "state.db-wal").stat().st_size > 0
    watched = {name: digest for name, digest in snapshot(home).items() if "-shm" not in name}
    db = str(tmp_path / "ledger.db")
    try:
        report = import_hermes(home, db=db, raw_keys=True)
        after = {n: d for n, d in snapshot(home).items() if "-shm" not in n}
        assert after == watched  # the database file and its WAL are untouched
        assert report.obligations_imported == 7
        ledger = DeliveryLedger.open(db)
        try:
            assert ledger.get(late).state == "attempting"
        finally:
            ledger.close()
    finally:
        inst.close()


def test_a_live_owner_on_this_host_keeps_its_rows(tmp_path: Path) -> None:
    """While the old gateway runs here, the rows it owns are its own: the sweep waits."""
    from gateway_ledger.infrastructure.ownership.process_identity import process_start_time

    home = tmp_path / "hermes"
    inst = Installation(home)
    pid = os.getpid()
    live = inst.obligation(DM, "m-1", "in flight", "attempting", NOW - 5, owner_pid=pid,
                           owner_started_at=process_start_time(pid))  # fmt: skip
    inst.commit()
    inst.close()
    db = str(tmp_path / "ledger.db")
    import_hermes(home, db=db, raw_keys=True)
    ledger = DeliveryLedger.open(db)
    try:
        assert live not in {i["obligation_id"] for i in ledger.sweep_recoverable()}
    finally:
        ledger.close()


def test_a_cleanly_stopped_installation_gains_no_file(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, _ = installation
    before = snapshot(home)
    assert not any(name.endswith("-wal") for name in before)  # closed cleanly
    import_hermes(home, db=str(tmp_path / "ledger.db"), raw_keys=True)
    assert snapshot(home) == before


def test_the_import_reads_naive_times_in_the_zone_it_is_told(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, _ = installation
    db = str(tmp_path / "ledger.db")
    report = import_hermes(home, db=db, raw_keys=True, timezone="Asia/Tokyo")
    assert "Asia/Tokyo" in report.time_basis
    store = SessionStore.open(db, raw_keys=True)
    try:
        question, answer = store.history(session_id(T0, 3))
    finally:
        store.close()
    # the JSONL's ISO line was written as naive local time; its epoch line is UTC as it is
    written = datetime.fromisoformat(naive(T0 + 5)).replace(tzinfo=ZoneInfo("Asia/Tokyo"))
    assert question.timestamp == written
    assert answer.timestamp == datetime.fromtimestamp(T0 + 6, UTC)


def test_import_on_both_stores_and_twice(
    store_location: str, tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, ids = installation
    first = import_hermes(home, db=store_location, secret_dir=tmp_path / "secret")
    assert (first.keys_imported, first.obligations_imported) == (3, 6)
    again = import_hermes(home, db=store_location, secret_dir=tmp_path / "secret")
    assert again.nothing_new and again.keys_already_present == 3
    ledger = DeliveryLedger.open(store_location)
    try:
        assert ledger.get(ids["failed"]).state == "failed"
        assert {i["obligation_id"] for i in ledger.sweep_recoverable()} == {
            ids["attempting"],
            ids["pending"],
            ids["claimed"],
            ids["failed"],
        }
    finally:
        ledger.close()


def test_an_imported_obligation_takes_its_fact_once_and_only_first() -> None:
    from gateway_ledger.application.delivery.importing import ImportedRow, imported_obligation
    from gateway_ledger.domain.errors import IllegalTransition, InvalidInput

    row = ImportedRow(
        obligation_id="a" * 24, session_key=DM, platform="telegram", chat_id="99",
        thread_id=None, content="x", state="pending", attempts=0, created_at=T0,
        updated_at=T0, owner_pid=None, owner_started_at=None, last_error=None,
    )  # fmt: skip
    now = datetime.now(UTC)
    obligation = imported_obligation(row, host="h", boot_id="b", source="hermes", now=now)
    assert obligation.state == "pending" and not obligation.needs_marker
    with pytest.raises(IllegalTransition, match="imported"):
        obligation.note_import(
            source="hermes", source_state="pending", attempts=0, last_error="",
            created_at=T0, updated_at=T0, time_basis="utc", now=now,
        )  # fmt: skip
    with pytest.raises(InvalidInput, match="unknown state"):
        imported_obligation(attrs.evolve(row, state="sent"), host="h", boot_id="b",
                            source="hermes", now=now)  # fmt: skip
    exhausted = imported_obligation(
        attrs.evolve(row, state="attempting", attempts=3), host="h", boot_id="b",
        source="hermes", now=now,
    )  # fmt: skip
    assert (exhausted.state, exhausted.abandon_reason) == ("abandoned", "max_attempts")


def test_a_killed_import_is_run_again_without_duplicates(tmp_path: Path) -> None:
    from gateway_ledger.application.sessions.admin import list_sessions
    from tests.hermes_fixture import bulk

    home = tmp_path / "hermes"
    inst = Installation(home)
    bulk(inst, 1500, 20, 300, NOW - 3600)
    inst.close()
    db = str(tmp_path / "ledger.db")
    child = subprocess.Popen(
        [EXE, "import", "hermes", str(home), "--db", db, "--raw-keys"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_DB"},
    )
    deadline = time.monotonic() + 60
    while not Path(db).exists() or Path(db).stat().st_size < 200_000:  # some keys written
        assert child.poll() is None and time.monotonic() < deadline, "the import ended early"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    report = import_hermes(home, db=db, raw_keys=True)
    assert 0 < report.keys_already_present < 1500  # the killed run left whole keys only
    assert report.keys_imported + report.keys_already_present == 1500
    store = SessionStore.open(db, raw_keys=True)
    try:
        assert len(list_sessions(store)) == 1500
        status = store.status("agent:main:telegram:dm:100000")
        assert status is not None and len(store.history(status.session_id)) == 20
    finally:
        store.close()


def test_what_is_imported_is_sealed_at_rest(
    tmp_path: Path, installation: tuple[Path, dict[str, str]]
) -> None:
    home, _ = installation
    db = tmp_path / "ledger.db"
    import_hermes(home, db=db)
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.db*"))
    for text in ("plan my week", "your week", "topic question", "ReadTimeout", "alice"):
        assert text.encode() not in stored, text


def test_a_key_a_live_store_would_refuse_is_reported_and_left_out(tmp_path: Path) -> None:
    from gateway_ledger.domain.values import MAX_CONTENT_BYTES

    home = tmp_path / "hermes"
    inst = Installation(home)
    huge = "x" * (MAX_CONTENT_BYTES + 1)
    for n, content in enumerate(("fine", huge)):
        key = f"agent:main:telegram:dm:{n}"
        origin = source("telegram", str(n))
        sid = session_id(T0, 10 + n)
        inst.add_session(sid, key, origin, T0, [("user", content, T0 + 1, None)])
        inst.route(key, entry(key, sid, origin, T0, T0 + 1))
    inst.commit()
    inst.close()
    for dry_run in (True, False):
        report = import_hermes(home, db=tmp_path / "l.db", raw_keys=True, dry_run=dry_run)
        assert (report.keys_imported, report.keys_already_present) == (1, 0)
        assert [(p.file, p.item) for p in report.problems] == [
            ("state.db:gateway_routing", "key #2")
        ]
        assert "larger than" in report.problems[0].error
