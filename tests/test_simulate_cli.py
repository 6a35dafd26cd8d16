"""``gateway-ledger simulate`` through the real console script, on several seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_simulate_loses_nothing_and_labels_every_duplicate(seed: int, tmp_path: Path) -> None:
    db = tmp_path / "kept.db"
    done = subprocess.run(
        [
            SCRIPT,
            "simulate",
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
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stdout)
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
    }
    assert not any(report["audit_problems"].values()), report["audit_problems"]
    assert report["unresolved"] == 0
    assert report["obligations"] == 24 * 3
    assert report["kills"] >= 1
    assert report["delivered"] + sum(report["abandoned"].values()) == report["obligations"]
    assert "erased_sent" not in report and "poisoned" not in report  # --faults adds them
    assert db.exists()  # --db keeps the store
    assert done.stderr == ""  # piped: no progress output
