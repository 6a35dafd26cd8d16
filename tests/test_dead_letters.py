"""Dead letters an operator can act on (issue 19): grouped, shown, retried on the record,
pruned to their audit facts; counted in ``status`` and ``metrics``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from gateway_ledger.application.delivery.dead_letters import retry_dead_letter
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.projections.delivery.obligation_index import IndexQuery
from tests.operator_support import owner, record

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


def dead_letters(ledger: DeliveryLedger) -> None:
    """Two dead targets on telegram, one stale on discord, one delivered, one owed."""
    for oid in ("dt-1", "dt-2"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
        ledger.mark_failed(oid, "blocked", classification="dead_target")
        ledger.abandon(oid, reason="dead_target")
    ledger.record_obligation(
        obligation_id="st-1", session_key="s", platform="discord", chat_id="9", content="late"
    )
    ledger.mark_attempting("st-1")
    ledger.mark_failed("st-1", "timeout", classification="ambiguous")  # may have arrived
    ledger.abandon("st-1", reason="stale")
    record(ledger, "ok-1")
    ledger.mark_attempting("ok-1")
    ledger.mark_delivered("ok-1")
    record(ledger, "owed")


def test_an_abandoned_reply_is_retried_on_the_record_and_swept(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_400_001))
    dead_letters(ledger)
    with pytest.raises(InvalidInput):
        retry_dead_letter(ledger, "st-1", "")  # who asked is required
    with pytest.raises(IllegalTransition):
        retry_dead_letter(ledger, "ok-1", "alice")  # not a dead letter
    with pytest.raises(IllegalTransition):
        retry_dead_letter(ledger, "owed", "alice")
    status = retry_dead_letter(ledger, "st-1", "alice")
    assert status.state == "pending" and status.needs_marker  # the marker is kept
    events = ledger.history("st-1")
    assert events[-1].type == "DeadLetterRetried"
    assert events[-1].fields["requested_by"] == "alice"
    with pytest.raises(IllegalTransition):
        retry_dead_letter(ledger, "st-1", "alice")  # owed now, not a dead letter
    ledger.recoverable.catch_up()
    assert "st-1" in {e.obligation_id for e in ledger.recoverable.entries()}
    ledger.obligation_index.catch_up()
    entry = ledger.obligation_index.entries(IndexQuery(platform="discord"))[0]
    assert (entry.state, entry.abandon_reason, entry.retries) == ("pending", None, 1)
    for view in (ledger.recoverable, ledger.obligation_index):
        assert view.rebuild_and_verify().equal
    ledger.close()
    sweeper = DeliveryLedger.open(store_location, owner=owner(9_400_002))
    won = sweeper.sweep_recoverable()
    assert "st-1" in {w["obligation_id"] for w in won}
    assert sweeper.audit_duplicates().ok
    sweeper.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "USER": ""}
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120, env=env)


def test_dead_letters_through_the_console_script(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ledger = DeliveryLedger.open(db, owner=owner(9_400_003))
    dead_letters(ledger)
    ledger.close()
    listed = json.loads(cli("dead-letters", "--db", str(db), "--json").stdout)
    assert listed["count"] == 3
    groups = {(g["reason"], g["platform"], g["age"]): g["count"] for g in listed["groups"]}
    assert groups == {("dead_target", "telegram", "<1h"): 2, ("stale", "discord", "<1h"): 1}
    every = json.loads(cli("dead-letters", "list", "--all", "--db", str(db), "--json").stdout)
    assert {d["obligation_id"]: d["error_class"] for d in every["dead_letters"]} == {
        "dt-1": "dead_target",
        "dt-2": "dead_target",
        "st-1": "ambiguous",
    }
    shown = cli("dead-letters", "show", "dt-1", "--db", str(db))
    assert shown.returncode == 0 and "class=dead_target" in shown.stdout
    status = json.loads(cli("status", "--db", str(db), "--json").stdout)
    assert status["dead_letters"]["count"] == 3
    assert status["dead_letters"]["oldest_age_seconds"] >= 0
    metrics = cli("metrics", "--db", str(db)).stdout
    assert "gateway_ledger_dead_letters 3.0" in metrics

    nobody = cli("dead-letters", "retry", "st-1", "--db", str(db))
    assert nobody.returncode == 2 and "--by" in nobody.stderr
    retried = cli("dead-letters", "retry", "st-1", "--by", "alice", "--db", str(db), "--json")
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["state"] == "pending"
    again = cli("dead-letters", "retry", "ok-1", "--by", "alice", "--db", str(db))
    assert again.returncode == 2 and "dead letter retried" in again.stderr

    pruned = cli(
        "dead-letters", "prune", "--reason", "dead_target", "--older-than", "0s",
        "--db", str(db), "--json",
    )  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["pruned"] == 2
    assert not Path(f"{db}.archive.jsonl.gz").exists()  # the content is gone
    gone = cli("history", "dt-1", "--db", str(db))
    assert gone.returncode == 2
    assert "not archived" in gone.stderr and "error class dead_target" in gone.stderr
    status = json.loads(cli("status", "--db", str(db), "--json").stdout)
    assert status["dead_letters"]["count"] == 0 and status["pruned"] == 2
    assert "gateway_ledger_pruned_obligations 2.0" in cli("metrics", "--db", str(db)).stdout
    assert cli("verify", "--db", str(db)).returncode == 0


def test_dead_letters_prune_from_python_keeps_the_facts(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_400_004))
    dead_letters(ledger)
    report = ledger.prune(timedelta(0), archive="", reason="stale")
    assert report.pruned == 1
    stone = ledger.tombstone("st-1")
    assert stone is not None
    assert (stone.state, stone.abandon_reason, stone.error_class, stone.send_attempts) == (
        "abandoned",
        "stale",
        "ambiguous",
        1,
    )
    assert ledger.exists("dt-1") and ledger.exists("ok-1")
    ledger.close()
