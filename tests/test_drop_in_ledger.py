"""The drop-in module, exercised the way upstream's gateway calls ``gateway.delivery_ledger``
(hermes-formats.md §1.7): the producer records, marks attempting, sends, marks the outcome,
every call wrapped in try/except; a gateway killed mid-send; the next boot's redelivery
sweeps, sends with the marker, marks delivered. Real processes, a real store."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_ledger import delivery_ledger

PRODUCER = textwrap.dedent(
    """
    import os, sys, time
    from gateway_ledger import delivery_ledger  # was: from gateway import delivery_ledger

    session_key = "agent:main:telegram:dm:99"
    text = sys.argv[1]
    obligation_id = delivery_ledger.compute_obligation_id(session_key, str(4711 or ""), text)
    try:
        delivery_ledger.record_obligation(
            obligation_id=obligation_id, session_key=session_key, platform="telegram",
            chat_id="99", thread_id=None, content=text,
        )
        delivery_ledger.mark_attempting(obligation_id)
    except Exception as e:
        print("ledger failed", e, file=sys.stderr)
    print(obligation_id, flush=True)
    time.sleep(60)  # the send hangs: the gateway is killed here
    """
)


@pytest.fixture
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "hermes"
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.delenv("GATEWAY_LEDGER_DB", raising=False)
    delivery_ledger.configure(None)
    yield home
    delivery_ledger.close()


def test_upstreams_names_defaults_and_constants() -> None:
    assert delivery_ledger.MAX_ATTEMPTS == 3 and delivery_ledger.STALE_AFTER_SECONDS == 86400
    assert delivery_ledger.RECOVERED_MARKER.startswith("♻️ Recovered reply")
    assert delivery_ledger.RECOVERED_MARKER.endswith("duplicate:\n\n")
    # upstream's formula: the first 24 hex of sha256("key|ref|content")
    expected = hashlib.sha256("k|1|hi ♻".encode()).hexdigest()[:24]
    assert delivery_ledger.compute_obligation_id("k", "1", "hi ♻") == expected
    assert delivery_ledger.ledger_enabled({"gateway": {"delivery_ledger": "Off "}}) is False
    assert delivery_ledger.ledger_enabled({"gateway": {"delivery_ledger": 0}}) is False
    assert delivery_ledger.ledger_enabled({"gateway": {}}) is True
    assert delivery_ledger.ledger_enabled({"gateway": "not a mapping"}) is True  # errors: on


def test_a_gateway_in_upstreams_calling_style(hermes_home: Path) -> None:
    # the producer's ordinary path: record, attempting, send, delivered / failed
    key = "agent:main:telegram:dm:99"
    ok = delivery_ledger.compute_obligation_id(key, "1", "hello")
    delivery_ledger.record_obligation(
        obligation_id=ok, session_key=key, platform="telegram", chat_id=99, thread_id=None,
        content="hello",
    )  # fmt: skip
    delivery_ledger.mark_attempting(ok)
    delivery_ledger.mark_delivered(ok)
    bad = delivery_ledger.compute_obligation_id(key, "2", "too long")
    delivery_ledger.record_obligation(
        obligation_id=bad, session_key=key, platform="telegram", chat_id="99", thread_id="7",
        content="too long",
    )  # fmt: skip
    delivery_ledger.mark_attempting(bad)
    delivery_ledger.mark_failed(bad, "Bad Request: message is too long")
    # re-recording a delivered reply does not rewind it (upstream's INSERT OR REPLACE did)
    delivery_ledger.record_obligation(
        obligation_id=ok, session_key=key, platform="telegram", chat_id="99", thread_id=None,
        content="hello",
    )  # fmt: skip
    delivery_ledger.mark_delivered("0" * 24)  # unknown id: a silent no-op, as upstream
    delivery_ledger.mark_attempting(ok)  # illegal now: refused and logged, never raised
    rows = json.loads(delivery_ledger.debug_rows())
    assert [r["id"] for r in rows] == [bad, ok]  # newest change first
    assert set(rows[0]) == {
        "id", "session", "state", "attempts", "created_at", "updated_at", "last_error",
    }  # fmt: skip
    assert (rows[0]["state"], rows[0]["last_error"]) == (
        "failed",
        "Bad Request: message is too long",
    )
    assert (rows[1]["state"], rows[1]["session"], rows[1]["last_error"]) == ("delivered", key, None)
    assert isinstance(rows[1]["created_at"], float)
    assert (hermes_home / "gateway-ledger.db").exists()  # configured from the home directory
    assert len(json.loads(delivery_ledger.debug_rows(limit=1))) == 1


def test_a_killed_gateway_is_redelivered_with_the_marker_at_the_next_boot(
    hermes_home: Path,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, "your weekly plan"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert child.stdout is not None
        obligation_id = child.stdout.readline().strip()
        assert len(obligation_id) == 24, child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # the next boot: sweep with the connected adapters, send, mark, as run.py does
    assert delivery_ledger.sweep_recoverable(None, deliverable_platforms={"discord"}) == []
    claimed = delivery_ledger.sweep_recoverable(None, deliverable_platforms={"telegram"})
    assert claimed == [
        {
            "obligation_id": obligation_id,
            "session_key": "agent:main:telegram:dm:99",
            "platform": "telegram",
            "chat_id": "99",
            "thread_id": None,
            "content": "your weekly plan",
            "needs_marker": True,  # it was attempting: it may have arrived
            "attempts": 1,
        }
    ]
    sent = [
        (delivery_ledger.RECOVERED_MARKER if row["needs_marker"] else "") + row["content"]
        for row in claimed
    ]
    assert sent[0].startswith("♻️ Recovered reply")
    delivery_ledger.mark_delivered(obligation_id)
    assert delivery_ledger.sweep_recoverable() == []  # nothing is sent twice
    rows = json.loads(delivery_ledger.debug_rows())
    assert (rows[0]["id"], rows[0]["state"], rows[0]["attempts"]) == (obligation_id, "delivered", 1)


def test_configure_points_at_another_store(tmp_path: Path, hermes_home: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "ledger.db"
    delivery_ledger.configure(elsewhere)
    oid = delivery_ledger.compute_obligation_id("k", "", "x")
    delivery_ledger.record_obligation(
        obligation_id=oid, session_key="k", platform="telegram", chat_id="1", thread_id=None,
        content="x",
    )  # fmt: skip
    assert elsewhere.exists() and not (hermes_home / "gateway-ledger.db").exists()
    (hermes_home).mkdir(parents=True, exist_ok=True)
    (hermes_home / "config.yaml").write_text("gateway:\n  delivery_ledger: no  # off\n")
    assert delivery_ledger.ledger_enabled() is False
    (hermes_home / "config.yaml").write_text("gateway:\n  other: 1\n")
    assert delivery_ledger.ledger_enabled() is True
