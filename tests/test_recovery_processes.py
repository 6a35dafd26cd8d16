"""Crash recovery with real processes killed by real signals, on every store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

from recovery_support import dead_owner, python_child, record_orphans, view_snapshot

from gateway_ledger.bootstrap import DeliveryLedger


def test_sweep_claims_what_a_killed_process_left_pending_and_attempting(
    store_location: str,
) -> None:
    child = python_child(
        f"""
        import sys, time
        from gateway_ledger.bootstrap import DeliveryLedger
        ledger = DeliveryLedger.open({store_location!r})
        for oid in ("left-pending", "left-attempting"):
            ledger.record_obligation(
                obligation_id=oid, session_key="agent:main:telegram:dm:7",
                platform="telegram", chat_id="7", thread_id="t1", content="the answer",
                reply_to="m41", media=[{{"kind": "image", "uri": "file:///a.png"}}],
                metadata={{"parse_mode": "HTML"}},
            )
        ledger.mark_attempting("left-attempting")
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL

    ledger = DeliveryLedger.open(store_location)
    won = {item["obligation_id"]: item for item in ledger.sweep_recoverable()}
    assert set(won) == {"left-pending", "left-attempting"}
    assert won["left-pending"]["needs_marker"] is False
    assert won["left-attempting"]["needs_marker"] is True
    item = won["left-attempting"]
    assert {k: item[k] for k in ("platform", "chat_id", "thread_id", "reply_to", "attempts")} == {
        "platform": "telegram",
        "chat_id": "7",
        "thread_id": "t1",
        "reply_to": "m41",
        "attempts": 1,
    }
    assert item["content"] == "the answer"
    assert item["media"][0]["uri"] == "file:///a.png"
    assert item["metadata"] == {"parse_mode": "HTML"}
    assert ledger.last_sweep is not None and ledger.last_sweep.claimed == 2

    assert ledger.sweep_recoverable() == []
    assert ledger.last_sweep.claimed == 0 and ledger.last_sweep.skipped_own == 2
    assert {e.state for e in ledger.recoverable.entries()} == {"claimed"}


def test_a_claimer_that_dies_is_reclaimed_with_the_marker(store_location: str) -> None:
    (oid,) = record_orphans(store_location, 1)
    child = python_child(
        f"""
        import json, time
        from gateway_ledger.bootstrap import DeliveryLedger
        ledger = DeliveryLedger.open({store_location!r})
        print(json.dumps(ledger.sweep_recoverable()), flush=True)
        time.sleep(60)
        """
    )
    assert child.stdout is not None
    (claimed,) = json.loads(child.stdout.readline())
    assert (claimed["obligation_id"], claimed["needs_marker"]) == (oid, False)

    parent = DeliveryLedger.open(store_location)
    assert parent.sweep_recoverable() == []  # the claimer is alive: hands off
    assert parent.last_sweep is not None and parent.last_sweep.skipped_alive == 1

    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    (again,) = parent.sweep_recoverable()
    assert (again["obligation_id"], again["needs_marker"], again["attempts"]) == (oid, True, 2)


SWEEPER = """
import faulthandler, json, sys
faulthandler.dump_traceback_later(90, exit=True)  # a hang fails with every thread's stack
from gateway_ledger.bootstrap import DeliveryLedger
ledger = DeliveryLedger.open({location!r})
ledger.recoverable.catch_up()
print("ready", flush=True)
sys.stdin.readline()
won = ledger.sweep_recoverable()
r = ledger.last_sweep
print(json.dumps({{"won": [w["obligation_id"] for w in won], "lost": r.lost_races,
                  "claimed": r.claimed, "alive": r.skipped_alive}}), flush=True)
sys.stdin.readline()  # exit only when told: see the test
"""


def test_four_sweepers_at_once_claim_each_obligation_exactly_once(
    store_location: str, tmp_path: Path
) -> None:
    """Exactly once among LIVE sweepers: no child exits before all four have reported.

    A sweeper that exited is a dead owner, and a slower sibling that first meets its
    claims after that rightly takes them over with the marker (a claimer that died before
    sending). Under I/O load one child once finished, exited and was reaped while another
    still waited on a commit; that one then claimed all 500 a second time.
    """
    ids = record_orphans(store_location, 500)
    # stderr goes to files: the parent reads only stdout while the children run.
    logs = [tmp_path / f"sweeper-{n}.stderr" for n in range(4)]
    children = []
    for log in logs:
        with log.open("w") as err:  # the child has its own copy of the descriptor
            children.append(python_child(SWEEPER.format(location=store_location), stderr=err))
    for child, log in zip(children, logs, strict=True):
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready", log.read_text()
    for child in children:  # release them together
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child, log in zip(children, logs, strict=True):
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, f"sweeper exited {child.wait(timeout=120)} unreported: {log.read_text()}"
        reports.append(json.loads(line))
    for child, log in zip(children, logs, strict=True):  # all reported: now they may exit
        child.communicate("exit\n", timeout=120)
        assert child.returncode == 0, log.read_text()

    per_obligation = Counter(oid for report in reports for oid in report["won"])
    assert set(per_obligation) == set(ids)  # the union is all 500
    assert set(per_obligation.values()) == {1}  # each claimed by exactly one
    assert sum(r["claimed"] for r in reports) == 500
    for r in reports:  # every candidate is accounted for: won, lost, or seen taken
        assert r["claimed"] + r["lost"] + r["alive"] == 500
    ledger = DeliveryLedger.open(store_location)
    sample = ids[::50]
    for oid in sample:
        assert [h.type for h in ledger.history(oid)] == ["Recorded", "Claimed"]


def test_sweep_killed_before_its_view_update_leaves_a_view_the_next_sweep_repairs(
    store_location: str,
) -> None:
    ids = record_orphans(store_location, 30)
    # The child claims everything, then dies inside the view transaction that would
    # record those claims: the events are in the store, the view change is not.
    child = python_child(
        f"""
        import os, signal
        from gateway_ledger.bootstrap import DeliveryLedger
        ledger = DeliveryLedger.open({store_location!r})
        view = ledger.recoverable
        view.catch_up()
        applied = []
        real_apply = view.apply
        def apply_then_die(cursor, dialect, event, sink):
            real_apply(cursor, dialect, event, sink)
            applied.append(event)
            if len(applied) == 5:
                os.kill(os.getpid(), signal.SIGKILL)
        view.apply = apply_then_die
        ledger.sweep_recoverable()
        """
    )
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL

    ledger = DeliveryLedger.open(store_location)
    claimed_by_child = [h for oid in ids for h in ledger.history(oid) if h.type == "Claimed"]
    assert len(claimed_by_child) == 30  # the events were appended before the kill
    assert {e.state for e in ledger.recoverable.entries()} == {"pending"}  # view untouched
    assert ledger.recoverable.runner.lag() > 0

    won = ledger.sweep_recoverable()  # catches up first, then re-claims from the dead child
    assert sorted(w["obligation_id"] for w in won) == ids
    assert all(w["needs_marker"] and w["attempts"] == 2 for w in won)
    incremental = view_snapshot(ledger)
    assert ledger.recoverable.rebuild() > 0
    assert view_snapshot(ledger) == incremental
    assert {row[4] for row in incremental} == {ledger.owner}
    assert ledger.recoverable.runner.lag() == 0


def test_live_owners_are_never_swept_until_they_die(store_location: str) -> None:
    child = python_child(
        f"""
        import time
        from gateway_ledger.bootstrap import DeliveryLedger
        ledger = DeliveryLedger.open({store_location!r})
        ledger.record_obligation(obligation_id="busy", session_key="agent:main:x:dm:1",
                                 platform="telegram", chat_id="1", content="working on it")
        ledger.mark_attempting("busy")
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    ledger = DeliveryLedger.open(store_location)
    for _ in range(2):
        assert ledger.sweep_recoverable() == []
        assert ledger.last_sweep is not None and ledger.last_sweep.skipped_alive == 1
    assert ledger.get("busy").send_attempts == 1
    assert ledger.get("busy").recovery_attempts == 0

    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert [w["obligation_id"] for w in ledger.sweep_recoverable()] == ["busy"]


def test_recording_orphans_helper_really_makes_dead_owners(store_location: str) -> None:
    owner = dead_owner()
    record_orphans(store_location, 2, owner=owner)
    ledger = DeliveryLedger.open(store_location)
    assert ledger.get("orphan-00000").owner == owner
    assert subprocess.run(["kill", "-0", str(owner.pid)], capture_output=True).returncode != 0
