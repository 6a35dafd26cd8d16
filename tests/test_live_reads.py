"""Every read command is safe against a live store (issue 19): run them all in a loop, the
real console script in child processes, while ``simulate`` writes through its gateways;
the gateways meet no ledger fault (no lock error), every command answers, and the store
verifies afterwards."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")

READS: tuple[tuple[str, ...], ...] = (
    ("status", "--json"),
    ("list", "--json", "--limit", "50"),
    ("audit", "duplicates", "--json"),
    ("sweep", "--json"),
    ("projections", "status", "--json"),
    ("dead-letters", "--json"),
    ("metrics",),
    ("prune", "--older-than", "0s", "--dry-run", "--json"),
)


def some_obligation(db: Path) -> str | None:
    done = subprocess.run(
        [SCRIPT, "list", "--db", str(db), "--json", "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        return None
    found = json.loads(done.stdout)["obligations"]
    return found[0]["obligation_id"] if found else None


def has_events(db: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return bool(conn.execute("SELECT COUNT(*) FROM stored_events").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def test_read_commands_in_a_loop_while_simulate_writes(tmp_path: Path) -> None:
    db = tmp_path / "live.db"
    sim = subprocess.Popen(
        [SCRIPT, "simulate", "--json", "--db", str(db), "--conversations", "200",
         "--turns", "3", "--workers", "2", "--kills", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    runs: dict[str, int] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def loop(args: tuple[str, ...]) -> None:
        """One read command again and again while simulate runs (at least twice)."""
        n = 0
        while sim.poll() is None or n < 2:
            command = args
            if args[0] == "history":
                oid = some_obligation(db)
                if oid is None:
                    continue
                command = ("history", oid, "--json")
            done = subprocess.run(
                [SCRIPT, *command, "--db", str(db)], capture_output=True, text=True, timeout=120
            )
            n += 1
            with lock:
                runs[args[0]] = runs.get(args[0], 0) + 1
                if done.returncode != 0 or "locked" in done.stderr:
                    failures.append(f"{' '.join(command)}: {done.returncode} {done.stderr.strip()}")

    try:
        deadline = time.monotonic() + 60
        while not has_events(db) and time.monotonic() < deadline:
            time.sleep(0.05)
        threads = [threading.Thread(target=loop, args=(a,)) for a in [*READS, ("history",)]]
        for thread in threads:
            thread.start()
        out, err = sim.communicate(timeout=300)
        for thread in threads:
            thread.join(timeout=300)
    finally:
        if sim.poll() is None:
            sim.kill()
            sim.wait()
    report = json.loads(out)
    judged = ("lost", "unlabelled_duplicates", "unresolved", "gateway_failures", "out_of_order")
    judged += ("rate_limit_violations", "bans", "audit_problems", "platforms")
    assert sim.returncode == 0, ({k: report.get(k) for k in judged}, err)  # what failed
    assert report["ledger_faults"] == 0 and report["lost"] == 0  # no lock error in a gateway
    assert b"locked" not in err
    assert not failures, failures
    assert len(runs) == len(READS) + 1 and all(n >= 2 for n in runs.values()), runs
    verified = subprocess.run(
        [SCRIPT, "verify", "--db", str(db), "--json"], capture_output=True, text=True, timeout=120
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    integrity = subprocess.run(
        [sys.executable, "-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]);"
         "print(c.execute('PRAGMA integrity_check').fetchone()[0])", str(db)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert integrity.stdout.strip() == "ok"
