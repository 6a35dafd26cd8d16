"""End to end: a real gateway process, killed with SIGKILL mid-send, restarted.

The fake platforms journal what they receive in their own SQLite files (the users' view).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.entrypoints.simulation.platform import PlatformBehaviour, read_journal
from gateway_ledger.entrypoints.simulation.workload import Turn

WORKER = "gateway_ledger.entrypoints.simulation.worker"


def turn(
    n: int, platform: str, content: str, parts: tuple[str, ...] = (), media: tuple[str, ...] = ()
) -> Turn:
    return Turn(
        conversation=n,
        index=0,
        session_key=f"agent:main:{platform}:dm:{n}",
        platform=platform,
        chat_id=str(n),
        inbound_id=f"in-{n}",
        content=content,
        parts=parts,
        media=media,
        think=0.0,
    )


TURNS = [
    turn(0, "fast", "fast reply"),
    turn(1, "slow", "slow reply"),
    turn(
        2,
        "slow",
        "part one|part two|part three",
        ("part one|", "part two|", "part three"),
        ("file:///m/2.png",),
    ),
    turn(3, "later", "owed to an offline platform"),
]


def spec(tmp: Path, *, hold: float, connected: list[str]) -> Path:
    path = tmp / f"spec-{hold}.json"
    platforms = {
        "fast": PlatformBehaviour(),
        "slow": PlatformBehaviour(hold_after_arrival=hold),
        "later": PlatformBehaviour(),
    }
    path.write_text(
        json.dumps(
            {
                "db": str(tmp / "ledger.db"),
                "journal_dir": str(tmp),
                "run_dir": str(tmp),
                "workers": 1,
                "connected": connected,
                "platforms": {n: b.to_dict() for n, b in platforms.items()},
                "turns": [t.to_dict() for t in TURNS],
            }
        )
    )
    return path


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the gateway process")
        time.sleep(0.02)


def test_killed_mid_send_every_reply_arrives_marked_exactly_where_it_may_repeat(
    tmp_path: Path,
) -> None:
    first = spec(tmp_path, hold=60.0, connected=["fast", "slow"])
    proc = subprocess.Popen([sys.executable, "-m", WORKER, str(first), "worker", "0"])
    try:
        # The two slow sends have reached the platform; their confirmations never will.
        wait_for(
            lambda: (
                len(read_journal(tmp_path / "slow.db")) == 2
                and len(read_journal(tmp_path / "fast.db")) == 1
            )
        )
        time.sleep(0.2)  # let the fast reply's Delivered commit
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    second = spec(tmp_path, hold=0.0, connected=["fast", "slow", "later"])
    restarted = subprocess.run(
        [sys.executable, "-m", WORKER, str(second), "worker", "0"], timeout=60, check=True
    )
    assert restarted.returncode == 0

    fast = [m.content for m in read_journal(tmp_path / "fast.db")]
    slow = [(m.content, m.media_uri) for m in read_journal(tmp_path / "slow.db")]
    later = [m.content for m in read_journal(tmp_path / "later.db")]
    assert fast == ["fast reply"]  # confirmed before the kill: never re-sent
    assert later == ["owed to an offline platform"]  # never attempted: re-sent plain
    first_two = sorted(c for c, _ in slow[:2])
    assert first_two == ["part one|", "slow reply"]  # what arrived before the kill
    resent = sorted(slow[2:], key=lambda x: (x[1] or "", x[0]))
    assert resent == sorted(
        [
            (f"{DUPLICATE_NOTICE}\nslow reply", None),  # may have arrived: marked
            (f"{DUPLICATE_NOTICE}\npart one|", None),  # the part in flight: marked
            ("part two|", None),  # parts never started: plain
            ("part three", None),
            ("", "file:///m/2.png"),
        ],
        key=lambda x: (x[1] or "", x[0]),
    )
    ledger = DeliveryLedger.open(tmp_path / "ledger.db")
    for t in TURNS:
        status = ledger.get(compute_obligation_id(t.session_key, t.inbound_id, t.content))
        assert status.state == "delivered"
        assert status.reply_to == t.inbound_id
