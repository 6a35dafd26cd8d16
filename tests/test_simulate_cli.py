"""``gateway-ledger simulate`` through the real console script, on several seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from tests.conftest import close_left_open

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


SMALL = ["--conversations", "24", "--turns", "3", "--workers", "2", "--kills", "3"]


def simulate(*args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        [SCRIPT, "simulate", "--json", *args], capture_output=True, text=True, timeout=120
    )
    return done, json.loads(done.stdout)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_simulate_loses_nothing_and_labels_every_duplicate(seed: int, tmp_path: Path) -> None:
    db = tmp_path / "kept.db"
    done, report = simulate("--seed", str(seed), *SMALL, "--db", str(db))
    assert done.returncode == 0, report
    assert report["lost"] == 0
    assert report["unlabelled_duplicates"] == 0
    # The ledger's own history agrees with what the platforms received.
    assert set(report["audit_problems"]) == {
        "unmarked_resend",
        "double_claim",
        "claim_from_live_owner",
        "late_result",
        "undecodable_event",
        "unreadable_fields",
        "resend_after_arrived",
    }
    assert not any(report["audit_problems"].values()), report["audit_problems"]
    assert report["unresolved"] == 0
    assert report["obligations"] == 24 * 3
    assert report["kills"] >= 1
    assert report["delivered"] + sum(report["abandoned"].values()) == report["obligations"]
    assert "erased_sent" not in report and "poisoned" not in report  # --faults adds them
    assert db.exists()  # --db keeps the store
    assert done.stderr == ""  # piped: no progress output


RECONCILING = ("slack", "whatsapp", "discord")


def test_reconciliation_settles_what_no_reconcile_labels_on_the_same_seed() -> None:
    """ADR 0050: on the platforms that can say what arrived, the possible duplicates that
    --no-reconcile labels are settled instead; telegram cannot, and labels as before."""
    done, with_it = simulate("--seed", "4", *SMALL)
    assert done.returncode == 0, with_it
    done, without = simulate("--seed", "4", *SMALL, "--no-reconcile")
    assert done.returncode == 0, without
    for report in (with_it, without):
        assert (report["lost"], report["unlabelled_duplicates"]) == (0, 0)
        assert set(report["platforms"]) == {"telegram", *RECONCILING}
        for figures in report["platforms"].values():
            assert {
                "labelled_duplicates",
                "reconciled_arrived",
                "reconciled_not_arrived",
                "reconciled_unknown",
            } <= set(figures)
    assert without["reconcile"] is False and without["reconcile_round_trips"] == 0
    assert all(without["platforms"][p]["reconciled_arrived"] == 0 for p in without["platforms"])
    labelled = sum(with_it["platforms"][p]["labelled_duplicates"] for p in RECONCILING)
    baseline = sum(without["platforms"][p]["labelled_duplicates"] for p in RECONCILING)
    assert labelled <= baseline // 10, (labelled, baseline)
    answered = sum(
        with_it["platforms"][p][f"reconciled_{o}"]
        for p in RECONCILING
        for o in ("arrived", "not_arrived", "unknown")
    )
    uncertain = sum(with_it["platforms"][p]["uncertain_sends"] for p in RECONCILING)
    assert 0 < answered <= uncertain  # asked only after uncertain sends, at most once each
    # Each request's answer is recorded by the gateway that asked, unless a kill took that
    # gateway first: the reply's claimer asks again, after its own uncertain send.
    assert with_it["reconcile_unrecorded"] == 0
    assert with_it["reconcile_round_trips"] - with_it["reconcile_lost_to_kills"] <= answered


def test_a_request_without_its_answer_is_put_on_the_kill_that_took_its_asker() -> None:
    """The report's account of reconciliation requests (``unrecorded_requests``): matched
    to the ``Reconciled`` of the process that asked; an unmatched one is a kill's when that
    process never finished, unexplained when it did; unread obligations are not judged."""
    from collections import Counter

    from gateway_ledger.entrypoints.simulation.driver import unrecorded_requests

    asked = Counter({("o1", 10): 1, ("o1", 11): 1, ("o2", 12): 2, ("o3", 13): 1, ("o4", 14): 1})
    answered = Counter({("o1", 11): 1, ("o2", 12): 1, ("o3", 99): 1})
    read = {"o1", "o2", "o3"}
    finished = {11, 12, 14}
    # o1: 10 was killed before recording, 11 recorded; o2: 12 finished with one of its two
    # answers unrecorded; o3: 13 killed, another process's answer does not count for it;
    # o4: not read (unreadable in a --faults run), so not judged.
    assert unrecorded_requests(asked, answered, read, finished) == (2, 1)


def test_simulate_refuses_a_store_that_holds_another_runs_events(
    store_location: str,
) -> None:
    """A run counts every obligation in its store: on a store that holds another run's,
    those would be judged lost. The run is refused before anything starts."""
    ledger = DeliveryLedger.open(store_location)
    ledger.record_obligation(
        obligation_id="left-over", session_key="k", platform="telegram", chat_id="c", content="hi"
    )
    ledger.close()
    close_left_open()
    done = subprocess.run(
        [SCRIPT, "simulate", "--db", store_location, *SMALL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "already holds 1 event(s)" in done.stderr
    assert done.stdout == ""
