"""Every operator command through the real console script, on a store made by simulate."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.application.delivery.metrics import METRIC_NAMES
from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
from gateway_ledger.domain.sessions.source import SessionSource
from tests.operator_support import owner, plant_late_delivery, plant_unmarked_resend, record

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")
COMMANDS = [
    ["status"],
    ["list"],
    ["history"],
    ["retry"],
    ["abandon"],
    ["sweep"],
    ["audit"],
    ["audit", "duplicates"],
    ["projections"],
    ["projections", "status"],
    ["projections", "rebuild"],
    ["projections", "follow"],
    ["sessions"],
    ["sessions", "list"],
    ["sessions", "show"],
    ["sessions", "export"],
    ["sessions", "forget"],
    ["metrics"],
]


def run(*args: str, db: Path | str | None = None, check: int | None = 0) -> Any:
    env = dict(os.environ)
    env.pop("GATEWAY_LEDGER_DB", None)
    if db is not None:
        env["GATEWAY_LEDGER_DB"] = str(db)
    done = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def run_json(*args: str, db: Path | str, check: int = 0) -> Any:
    return json.loads(run(*args, "--json", db=db, check=check).stdout)


@pytest.fixture(scope="session")
def sim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small simulate store per test session, plus two conversations in its sessions."""
    folder = tmp_path_factory.mktemp("simulated")
    db = folder / "sim.db"
    run(
        "simulate",
        "--seed",
        "4",
        "--conversations",
        "16",
        "--turns",
        "2",
        "--workers",
        "2",
        "--kills",
        "2",
        "--db",
        str(db),
    )
    store = SessionStore.open(db)
    for chat in ("100", "200"):
        context = store.resolve(
            SessionSource(platform="telegram", chat_id=chat, user_id="u" + chat)
        )
        store.append(context, "user", "hello there")
        store.append(context, "assistant", "hi!")
    store.close()
    return folder


@pytest.fixture
def store(sim_dir: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of the simulate store, for commands that append."""
    copy = tmp_path / "copy"
    shutil.copytree(sim_dir, copy)
    yield copy / "sim.db"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help(command: list[str]) -> None:
    done = run(*command, "--help")
    assert "usage: gateway-ledger" in done.stdout


def test_status_counts_what_simulate_recorded(sim_dir: Path) -> None:
    db = sim_dir / "sim.db"
    stats = run_json("status", db=db)
    assert stats["total"] == 32
    assert sum(stats["by_state"].values()) == 32
    assert stats["unresolved"] == 0
    assert stats["delivery_seconds"]["count"] == stats["by_state"]["delivered"]
    assert stats["delivery_seconds"]["p50"] <= stats["delivery_seconds"]["p95"]
    assert {p["name"] for p in stats["projections"]} == {
        "recoverable_obligations",
        "obligation_index",
    }
    human = run("status", "--db", str(db)).stdout
    assert "platform" in human and "record to delivery" in human and "abandoned by reason" in human


def test_list_filters_by_state_platform_since_and_session(sim_dir: Path) -> None:
    db = sim_dir / "sim.db"
    every = run_json("list", "--limit", "1000", db=db)["obligations"]
    assert len(every) == 32
    delivered = run_json("list", "--state", "delivered", db=db)["obligations"]
    assert delivered and all(o["state"] == "delivered" for o in delivered)
    platform = every[0]["platform"]
    same = run_json("list", "--platform", platform, db=db)["obligations"]
    assert same and all(o["platform"] == platform for o in same)
    assert len(run_json("list", "--since", "1h", db=db)["obligations"]) == 32
    assert run_json("list", "--since", "2999-01-01T00:00:00Z", db=db)["obligations"] == []
    ledger = DeliveryLedger.open(db)
    key = ledger.get(every[0]["obligation_id"]).session_key
    ledger.close()
    mine = run_json("list", "--session", key, db=db)["obligations"]
    assert every[0]["obligation_id"] in {o["obligation_id"] for o in mine}
    assert all(o["subject_id"] == mine[0]["subject_id"] for o in mine)
    assert key not in json.dumps(mine)  # the session key itself is never shown
    table = run("list", "--state", "delivered", db=db).stdout.splitlines()
    assert table[0].split()[:3] == ["obligation", "state", "platform"]


def test_history_shows_every_event_and_a_past_state(sim_dir: Path) -> None:
    db = sim_dir / "sim.db"
    claimed = [o for o in run_json("list", "--limit", "1000", db=db)["obligations"] if o["claims"]]
    oid = (claimed or run_json("list", db=db)["obligations"])[0]["obligation_id"]
    full = run_json("history", oid, db=db)
    types = [e["type"] for e in full["history"]]
    assert types[0] == "Recorded" and full["status"]["state"] == full["status"]["state"]
    first = full["history"][0]["timestamp"]
    past = run_json("history", oid, "--at", first, db=db)
    assert [e["type"] for e in past["history"]] == ["Recorded"]
    assert past["status"]["state"] == "pending"
    assert past["later_events"] == len(types) - 1
    human = run("history", oid, db=db).stdout
    assert "Recorded" in human and "when (UTC)" in human
    # The simulated gateways send through Gateway.deliver, which records each send's guard.
    # A claimed reply may never have been attempted by its first gateway (killed while it
    # waited its turn in its chat), and a claimer sends without Attempting: the guard is
    # read from a reply that deliver itself sent.
    sent = [
        o
        for o in run_json("list", "--state", "delivered", "--limit", "1000", db=db)["obligations"]
        if not o["claims"]
    ]
    assert sent, "simulate delivered no reply without a claim"
    sent_id = sent[0]["obligation_id"]
    types = [e["type"] for e in run_json("history", sent_id, db=db)["history"]]
    human = run("history", sent_id, db=db).stdout
    assert "Attempting" in types and "guard=" in human


def test_retry_and_abandon_are_refused_on_final_obligations(store: Path) -> None:
    delivered = run_json("list", "--state", "delivered", db=store)["obligations"][0]
    for args in (
        ["retry", delivered["obligation_id"]],
        ["abandon", delivered["obligation_id"], "--reason", "stuck"],
    ):
        done = run(*args, db=store, check=2)
        assert "refused" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert "Traceback" not in done.stderr


def test_retry_makes_a_stuck_obligation_claimable_and_abandon_stops_it(store: Path) -> None:
    ledger = DeliveryLedger.open(store, owner=owner(4_100_001))
    record(ledger, "stuck-1")
    record(ledger, "stuck-2")
    ledger.mark_attempting("stuck-1")
    ledger.close()
    retried = run_json("retry", "stuck-1", "--by", "alice", db=store)
    assert retried["state"] == "pending" and retried["fence"] == 1
    history = run_json("history", "stuck-1", db=store)["history"]
    assert history[-1]["type"] == "RetryRequested"
    assert history[-1]["fields"]["requested_by"] == "alice"
    before = run_json("projections", "status", db=store)["log_position"]
    preview = run_json("sweep", "--dry-run", db=store)
    planned = {a["obligation_id"]: a for a in preview["actions"]}
    assert planned["stuck-1"]["action"] == "claim" and planned["stuck-1"]["needs_marker"]
    assert run_json("projections", "status", db=store)["log_position"] == before
    run("abandon", "stuck-2", "--reason", "customer asked us to stop", db=store)
    assert run_json("history", "stuck-2", db=store)["status"]["abandon_reason"] == "operator"
    # A plain sweep previews (the CLI cannot send what it would claim); the claim is a
    # gateway's to make, and nothing was appended.
    swept = run_json("sweep", db=store)
    actions = {a["obligation_id"]: a["action"] for a in swept["actions"]}
    assert actions["stuck-1"] == "claim" and "stuck-2" not in actions  # abandoned meanwhile
    assert run_json("projections", "status", db=store)["log_position"] == before + 1


def test_audit_finds_no_problem_in_a_clean_simulate_run(sim_dir: Path) -> None:
    report = run_json("audit", "duplicates", db=sim_dir / "sim.db")
    assert report["ok"] and report["findings"] == []
    assert report["unlabelled_duplicates"] == 0
    assert report["events_scanned"] > 32
    run("audit", "duplicates", db=sim_dir / "sim.db", check=0)


def test_audit_finds_planted_duplicates(store: Path) -> None:
    late = plant_late_delivery(str(store))
    unmarked = plant_unmarked_resend(str(store))
    report = run_json("audit", "duplicates", db=store, check=1)
    kinds = {(f["kind"], f["obligation_id"]) for f in report["findings"]}
    assert ("late_result", late) in kinds
    assert ("claim_from_live_owner", late) in kinds
    assert ("unmarked_resend", unmarked) in kinds
    dups = {d["obligation_id"]: d for d in report["duplicates"]}
    assert dups[unmarked]["labelled"] is False and dups[late]["sends"] == 2
    human = run("audit", "duplicates", db=store, check=1).stdout
    assert "PROBLEMS FOUND" in human and unmarked in human


def test_projections_status_and_rebuild_prove_and_repair(store: Path) -> None:
    status = run_json("projections", "status", db=store)
    assert {p["name"] for p in status["projections"]} == {
        "recoverable_obligations",
        "obligation_index",
    }
    rebuilt = run_json("projections", "rebuild", db=store)
    assert rebuilt["ok"] and all(p["equal"] for p in rebuilt["projections"])
    with sqlite3.connect(store) as db:
        db.execute("UPDATE obligation_index SET state = 'failed' WHERE rowid = 1")
    broken = run_json("projections", "rebuild", "--name", "obligation_index", db=store, check=1)
    assert broken["projections"][0]["repaired"]
    assert "differs in state" in broken["projections"][0]["differences"][0]
    again = run("projections", "rebuild", "--name", "obligation_index", db=store)
    assert "OK" in again.stdout


def test_sessions_list_show_export_and_forget(store: Path, tmp_path: Path) -> None:
    sessions = run_json("sessions", "list", db=store)["sessions"]
    assert len(sessions) == 2
    key = sessions[0]["key"]
    shown = run_json("sessions", "show", key, db=store)
    assert shown["sessions"][0]["message_count"] == 2
    session_id = shown["current_session_id"]
    out = tmp_path / "export"
    run("sessions", "export", session_id, "--dir", str(out), db=store)
    lines = (out / f"{session_id}.jsonl").read_text().splitlines()
    assert [json.loads(line)["role"] for line in lines] == ["user", "assistant"]
    assert "messages" in run("sessions", "show", key, db=store).stdout
    forgotten = run_json("sessions", "forget", key, db=store)
    assert forgotten["subject_id"]


def test_metrics_are_prometheus_text_with_the_status_figures(sim_dir: Path) -> None:
    db = sim_dir / "sim.db"
    text = run("metrics", db=db).stdout
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text
    stats = run_json("status", db=db)
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert float(samples["gateway_ledger_unresolved_obligations"]) == stats["unresolved"]
    assert float(samples["gateway_ledger_recovery_claims_total"]) == stats["recovery_claims"]
    delivered = sum(
        float(v)
        for k, v in samples.items()
        if k.startswith("gateway_ledger_obligations{") and 'state="delivered"' in k
    )
    assert delivered == stats["by_state"]["delivered"]


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--db", "/nonexistent/nowhere.db"],
        ["history", "no-such-obligation"],
        ["list", "--since", "yesterday-ish"],
        ["retry", "no-such-obligation"],
        ["sessions", "show", "agent:main:nowhere:dm:x"],
        ["projections", "rebuild", "--name", "nope"],
    ],
)
def test_errors_exit_2_with_one_line(sim_dir: Path, args: list[str]) -> None:
    done = run(*args, db=sim_dir / "sim.db", check=2)
    assert done.stderr.startswith("gateway-ledger") or done.stderr.startswith("usage:")
    assert "Traceback" not in done.stderr
    if not done.stderr.startswith("usage:"):
        assert len(done.stderr.strip().splitlines()) == 1


def test_progress_bar_stays_quiet_when_piped(store: Path) -> None:
    done = run("projections", "rebuild", db=store)
    assert done.stderr == ""
    assert "\r" not in done.stdout  # no bar redrawn into the pipe either
    assert "every rebuild equals its incremental view" in done.stdout


def test_the_store_may_be_named_before_the_command(sim_dir: Path) -> None:
    db = str(sim_dir / "sim.db")
    before = json.loads(run("--db", db, "status", "--json").stdout)
    after = json.loads(run("status", "--db", db, "--json").stdout)
    assert before["total"] == after["total"] > 0
    missing = run("--db", str(sim_dir / "no" / "such.db"), "status", check=2)
    assert missing.stderr.startswith("gateway-ledger: no store at")
