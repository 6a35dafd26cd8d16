"""``backup``, ``restore`` and ``verify`` through the real console script (issue 19).

A backup taken while ``simulate`` writes is restored into a new file, verified, and
swept: every obligation it holds is either resolved or found by the sweep. On
PostgreSQL the documented round trip (pg_dump, pg_restore) is run for real.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.postgres import parse_postgres_url
from tests.operator_support import owner, record
from tests.quarantine_support import flip_first_byte

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=180, env=env, check=False
    )


def events_in(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM stored_events").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def test_backup_during_simulate_restores_verifies_and_sweeps(tmp_path: Path) -> None:
    live = tmp_path / "live.db"
    sim = subprocess.Popen(
        [SCRIPT, "simulate", "--json", "--db", str(live), "--conversations", "60",
         "--turns", "3", "--workers", "2", "--kills", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while events_in(live) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sim.poll() is None, "simulate ended before the backup could be taken"
        backup = tmp_path / "backup" / "copy.db"
        backup.parent.mkdir()
        done = cli("backup", str(backup), "--db", str(live), "--json")
        assert done.returncode == 0, done.stderr
        assert sim.poll() is None, "the backup was taken while simulate was writing"
        out, err = sim.communicate(timeout=180)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    report = json.loads(out)
    assert sim.returncode == 0, (report, err)
    assert report["ledger_faults"] == 0  # the gateways never met a lock error
    assert json.loads(done.stdout)["keys"] == []
    assert not Path(f"{backup}.key").exists()  # the master key stays apart
    assert backup.stat().st_mode & 0o777 == 0o600

    restored = tmp_path / "restored.db"
    done = cli("restore", str(backup), "--db", str(restored))
    assert done.returncode == 0, done.stderr
    shutil.copyfile(f"{live}.key", f"{restored}.key")
    os.chmod(f"{restored}.key", 0o600)
    verified = cli("verify", "--db", str(restored), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    result = json.loads(verified.stdout)
    assert result["ok"] and result["events_checked"] >= 40
    status = json.loads(cli("status", "--db", str(restored), "--json").stdout)
    sweep = json.loads(cli("sweep", "--db", str(restored), "--json").stdout)
    # Nothing owed is lost: every unresolved obligation of the copy is the sweep's.
    assert sweep["result"]["candidates"] == status["unresolved"]
    assert status["total"] > 0
    # The copy is a moment of the live store: each of its obligations is in the live one.
    live_ids = {
        e["obligation_id"]
        for e in json.loads(cli("list", "--db", str(live), "--json", "--limit", "100000").stdout)[
            "obligations"
        ]
    }
    copy_ids = {
        e["obligation_id"]
        for e in json.loads(
            cli("list", "--db", str(restored), "--json", "--limit", "100000").stdout
        )["obligations"]
    }
    assert copy_ids and copy_ids <= live_ids


def test_backup_refuses_an_existing_file_and_copies_keys_only_when_asked(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ledger = DeliveryLedger.open(db, owner=owner(9_000_001))
    record(ledger, "o-1")
    ledger.close()
    dest = tmp_path / "b.db"
    assert cli("backup", str(dest), "--db", str(db)).returncode == 0
    again = cli("backup", str(dest), "--db", str(db))
    assert again.returncode == 2 and "exists" in again.stderr
    keyed = cli("backup", str(dest), "--db", str(db), "--force", "--with-keys", "--json")
    assert keyed.returncode == 0, keyed.stderr
    assert Path(f"{dest}.key").read_bytes() == Path(f"{db}.key").read_bytes()
    assert Path(f"{dest}.key").stat().st_mode & 0o777 == 0o600
    assert cli("verify", "--db", str(dest)).returncode == 0
    pg = cli("backup", str(dest), "--db", "postgresql://127.0.0.1/test")
    assert pg.returncode == 2 and "pg_dump" in pg.stderr


def test_verify_reports_a_gap_and_an_undecodable_event(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ledger = DeliveryLedger.open(db, owner=owner(9_000_002))
    for oid in ("o-1", "o-2"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
    ledger.close()
    assert cli("verify", "--db", str(db)).returncode == 0
    flip_first_byte(str(db), "o-1", 2)
    conn = sqlite3.connect(db)
    with conn:
        (aggregate,) = conn.execute(
            "SELECT originator_id FROM stored_events WHERE originator_version = 2 "
            "AND originator_id <> (SELECT originator_id FROM stored_events "
            "WHERE originator_version = 2 ORDER BY rowid LIMIT 1) LIMIT 1"
        ).fetchone()
        conn.execute(
            "UPDATE stored_events SET originator_version = 5 WHERE originator_id = ? "
            "AND originator_version = 2",
            (aggregate,),
        )
    conn.close()
    done = cli("verify", "--db", str(db), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["undecodable_count"] == 1
    assert [s["last"] for s in report["broken_streams"]] == [5]


def test_postgres_round_trip_with_pg_dump(pg_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "GATEWAY_LEDGER_KEY_DIR": str(tmp_path / "keys")}
    os.environ["GATEWAY_LEDGER_KEY_DIR"] = env["GATEWAY_LEDGER_KEY_DIR"]
    try:
        ledger = DeliveryLedger.open(pg_url, owner=owner(9_000_003))
        for n in range(5):
            record(ledger, f"pg-{n}")
        ledger.mark_attempting("pg-0")
        ledger.mark_delivered("pg-0")
        ledger.close()
    finally:
        del os.environ["GATEWAY_LEDGER_KEY_DIR"]
    params = parse_postgres_url(pg_url)
    dump = tmp_path / "store.dump"
    conn = ["-h", params["host"], "-p", params["port"], "-U", params["user"]]
    subprocess.run(
        ["pg_dump", *conn, "--schema", params["schema"], "--format=custom", "-f", str(dump),
         params["dbname"]],
        check=True,
    )  # fmt: skip
    before = json.loads(cli("status", "--db", pg_url, "--json", env=env).stdout)
    subprocess.run(
        ["psql", *conn, "-q", "-c", f'DROP SCHEMA "{params["schema"]}" CASCADE', params["dbname"]],
        check=True,
    )  # fmt: skip
    assert cli("status", "--db", pg_url, env=env).returncode == 2  # gone
    subprocess.run(["pg_restore", *conn, "-d", params["dbname"], str(dump)], check=True)
    verified = cli("verify", "--db", pg_url, "--json", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    after = json.loads(cli("status", "--db", pg_url, "--json", env=env).stdout)
    assert (
        (after["total"], after["unresolved"])
        == (before["total"], before["unresolved"])
        == (
            5,
            4,
        )
    )


def test_backup_needs_an_existing_store(tmp_path: Path) -> None:
    done = cli("backup", str(tmp_path / "b.db"), "--db", str(tmp_path / "none.db"))
    assert done.returncode == 2 and "no store" in done.stderr
