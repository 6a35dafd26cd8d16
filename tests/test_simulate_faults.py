"""``gateway-ledger simulate --faults`` through the real console script, on both stores.

The run poisons two delivered obligations (a flipped byte, an event type this version
does not know), forgets sessions while replies of theirs are in flight and, on
PostgreSQL, stops a gateway with SIGSTOP past its lease. These tests check that each
fault was really planted and that the verdict holds: nothing lost, no unlabelled
duplicate, no erased reply sent, every obligation delivered, abandoned with a reason or
quarantined, the poisoned replies not sent again, the audit naming each poisoned one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gateway_ledger import DeliveryLedger
from gateway_ledger.bootstrap import forget_session
from gateway_ledger.entrypoints.simulation.faults import (
    Copies,
    Forgotten,
    poison_candidates,
    recorded_after_erasure,
    taken_after_erasure,
)
from gateway_ledger.entrypoints.simulation.order import part_key
from gateway_ledger.entrypoints.simulation.platform import Received
from gateway_ledger.entrypoints.simulation.report import FaultReport, Report
from gateway_ledger.entrypoints.simulation.workload import Turn

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")

FAULT_FIELDS = {
    "poisoned",
    "poisoned_ids",
    "poisoned_resent",
    "quarantined",
    "quarantined_ids",
    "forgotten",
    "erased_sent",
    "erased_abandoned",
    "paused",
    "paused_claimed",
    "paused_late_results",
    "late_results",
    "unaccounted",
}


def simulate_with_faults(seed: int, db: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    done = subprocess.run(
        [
            SCRIPT,
            "simulate",
            "--faults",
            "--json",
            "--seed",
            str(seed),
            "--conversations",
            "24",
            "--turns",
            "3",
            "--workers",
            "2",
            "--kills",
            "3",
            "--db",
            db,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, json.loads(done.stdout)


def assert_faults_planted_and_survived(
    done: subprocess.CompletedProcess[str], report: dict[str, Any]
) -> None:
    assert set(report) >= FAULT_FIELDS, FAULT_FIELDS - set(report)
    assert report["poisoned"] == 2 and len(report["poisoned_ids"]) == 2
    assert report["forgotten"] >= 1
    # What the faults must not do to users.
    assert report["erased_sent"] == 0, report
    assert report["poisoned_resent"] == 0, report
    assert report["lost"] == 0, report
    assert report["unlabelled_duplicates"] == 0, report
    # Every obligation ends delivered, abandoned with a reason, or quarantined.
    assert report["unaccounted"] == 0, report["unaccounted_ids"]
    assert report["unresolved"] == 0, report
    assert set(report["poisoned_ids"]) <= set(report["quarantined_ids"]), report
    assert report["quarantined_unplanted"] == 0, report["quarantined_ids"]
    assert report["quarantined_source"] == "stats()", report["quarantined_source"]
    assert report["poisoned_reported_by_audit"] == 2, report["audit_problems"]
    assert report["audit_error"] is None, report["audit_error"]
    assert report["ok"] is True and done.returncode == 0, report


def test_simulate_with_faults_on_sqlite(tmp_path: Path) -> None:
    done, report = simulate_with_faults(4, str(tmp_path / "faults.db"))
    assert report["paused"] == 0  # a lease is what a pause outlives: PostgreSQL only
    assert_faults_planted_and_survived(done, report)


def test_simulate_with_faults_on_postgres(pg_url: str) -> None:
    done, report = simulate_with_faults(5, pg_url)
    assert report["paused"] == 1
    assert report["paused_claimed"] >= 1, report  # stopped past its lease, then claimed
    assert_faults_planted_and_survived(done, report)


def test_the_judgment_tells_a_fresh_key_period_from_a_reply_the_erasure_covered(
    tmp_path: Path,
) -> None:
    """A CI run counted as "taken after the erasure" the reply of a conversation whose
    erasure found no key (its first turn was still being answered): recorded 7 ms before
    the erasure's record, under a fresh key, claimed and sent by another gateway after a
    kill. ADR 0071 lets that reply through as new data; a reply the erasure covered (its
    data under the destroyed key) stays judged."""
    db = str(tmp_path / "ledger.db")
    ledger = DeliveryLedger.open(db)
    try:

        def record(oid: str, key: str) -> None:
            ledger.record_obligation(
                obligation_id=oid, session_key=key, platform="telegram", chat_id="c", content="hi"
            )

        covered = Forgotten(conversation=1, session_key="agent:main:telegram:dm:1", chat_id="c")
        record("before", covered.session_key)
        covered.began_at = time.time()
        forget_session(db, covered.session_key)
        covered.finished_at = time.time()

        fresh = Forgotten(conversation=2, session_key="agent:main:telegram:dm:2", chat_id="c")
        fresh.began_at = time.time()
        forget_session(db, fresh.session_key)  # nothing recorded yet: no key to destroy
        record("after", fresh.session_key)  # the turn in progress, under a fresh key
        fresh.finished_at = time.time()

        for oid, erasure, excused in (("before", covered, False), ("after", fresh, True)):
            history = ledger.history(oid)
            erased = ledger.is_erased(oid)
            assert erased is not excused
            assert recorded_after_erasure(history, erasure, erased=erased) is excused
        # What the rule judges, unchanged: a claimer's send of the covered reply.
        claimer = Received(1, "c", None, None, "hi", None, None, -1, time.time() + 1)
        assert taken_after_erasure(claimer, ledger.history("before"), covered)
    finally:
        ledger.close()


def test_the_poison_hits_only_replies_whose_every_part_reached_the_user() -> None:
    """A CI run (SQLite, seed 4) counted a reply lost: the poison had hit an obligation
    with a ``Delivered`` event whose second part the platform took and then dropped. The
    status report of the drop had reopened it, a re-send was owed, and a quarantined
    obligation is never sent. Such a reply, or one with any part not on its platform, is
    no candidate; nor is a forgotten conversation's, nor an obligation of no turn."""

    def turn(conversation: int, parts: tuple[str, ...]) -> Turn:
        return Turn(
            conversation=conversation,
            index=0,
            session_key=f"agent:main:whatsapp:dm:{conversation}",
            platform="whatsapp",
            chat_id=str(conversation),
            inbound_id=f"in-{conversation}",
            content=" ".join(parts),
            parts=parts,
            media=(),
            think=0.0,
        )

    turns = {
        "whole": turn(1, ("first", "second")),
        "dropped": turn(2, ("first", "second")),  # its second part: taken, then dropped
        "forgotten": turn(3, ("only",)),
    }
    copies: Copies = {}
    arrived = [(1, "first"), (1, "second"), (2, "first"), (3, "only")]
    for seq, (conversation, text) in enumerate(arrived):
        msg = Received(seq, str(conversation), None, f"in-{conversation}", text, None, None)
        copies.setdefault(part_key(msg), []).append(msg)
    delivered = ["whole", "dropped", "forgotten", "not-a-turn"]
    assert poison_candidates(delivered, turns, {3}, copies) == ["whole"]
    assert poison_candidates(delivered, turns, (), copies) == ["forgotten", "whole"]


def test_a_failed_run_names_the_judgments_it_failed_first_in_its_report() -> None:
    """A CI failure printed a truncated report with ``ok`` at its end: ``failed`` leads."""
    assert Report(seed=1).failed == [] and Report(seed=1).ok
    report = Report(seed=1, lost=1, out_of_order=2, faults=FaultReport(erased_sent=1))
    assert report.failed == ["lost", "out_of_order", "erased_sent"] and not report.ok
    d = report.to_dict()
    assert next(iter(d)) == "failed" and d["failed"] == report.failed and d["ok"] is False
    assert d["erased_sent"] == 1 and "faults" not in d


def test_a_passing_run_removes_its_directory_and_a_failed_one_keeps_it_for_diagnosis() -> None:
    """The run's directory holds a store and its key file: gone after a passing run.
    A failed run's journals and logs are what tells which send went wrong: kept, named."""
    from gateway_ledger.entrypoints.simulation.driver import Simulation
    from gateway_ledger.entrypoints.simulation.report import SimulationConfig

    passing = Simulation(SimulationConfig(conversations=2, turns=1))
    (passing.run_dir / "ledger.db.key").write_bytes(b"k")
    report = Report(seed=1, db=passing.db)
    passing.tidy(report)
    assert not passing.run_dir.exists() and report.db == "" and report.kept == ""
    failed = Simulation(SimulationConfig(conversations=2, turns=1))
    report = Report(seed=1, db=failed.db, lost=1)
    failed.tidy(report)
    assert failed.run_dir.is_dir() and report.kept == str(failed.run_dir)
    assert report.db == failed.db and report.to_dict()["kept"] == report.kept
    shutil.rmtree(failed.run_dir)
