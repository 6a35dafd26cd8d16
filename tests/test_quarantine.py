"""One bad event never stops recovery, and nothing unreadable is ever sent (ADR 0027).

Bad bytes are planted with SQL straight into the real store (SQLite file, PostgreSQL
schema); operators' views are checked through the real console script.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gateway_fakes import ScriptedAdapter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from quarantine_support import (
    append_newer_event,
    flip_first_byte,
    set_state,
    stored_state,
    tamper_ciphertext,
)
from recovery_support import python_child, record_orphans

from gateway_ledger.bootstrap import DeliveryLedger, Gateway, forget_session
from gateway_ledger.infrastructure.privacy.private_mapper import UNREADABLE

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")
SESSION = "agent:main:telegram:dm:77"


def cli(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_LEDGER_DB"}
    done = subprocess.run(
        [SCRIPT, *args, "--db", db], capture_output=True, text=True, timeout=120, env=env
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def deliver_one(location: str, oid: str = "long-delivered") -> str:
    """An obligation recorded, sent and confirmed long ago by a gateway now gone."""
    ledger = DeliveryLedger.open(location)
    try:
        ledger.record_obligation(
            obligation_id=oid, session_key=SESSION, platform="telegram", chat_id="77", content="hi"
        )
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid, ["m-1"])
    finally:
        ledger.close()
    return oid


POISONS = {
    # a flipped bit in the stored Delivered event (v3): its bytes are no JSON any more
    "flipped_byte": (lambda loc, oid: flip_first_byte(loc, oid, 3), 3, "undecodable"),
    # an event type written by a newer release during a rolling upgrade
    "newer_event_type": (lambda loc, oid: append_newer_event(loc, oid, 4), 4, "unknown_topic"),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_one_bad_event_is_quarantined_and_every_other_obligation_is_recovered(
    store_location: str, poison: str
) -> None:
    plant, bad_version, reason = POISONS[poison]
    poisoned = deliver_one(store_location)
    (owed,) = record_orphans(store_location, 1, prefix="owed")
    plant(store_location, poisoned)

    gateway = DeliveryLedger.open(store_location)
    won = gateway.sweep_recoverable()
    assert [item["obligation_id"] for item in won] == [owed]
    assert won[0]["content"] == f"reply {owed}"
    assert gateway.last_sweep is not None and gateway.last_sweep.quarantined == 1
    stats = gateway.stats()
    assert (stats.quarantined, stats.quarantined_ids) == (1, (poisoned,))
    assert stats.by_state["delivered"] == 0  # not counted as delivered
    (entry,) = gateway.list(state="quarantined")
    assert (entry.obligation_id, entry.quarantine_reason) == (poisoned, reason)
    assert entry.quarantine_version == bad_version
    assert gateway.sweep_recoverable() == []  # never claimed, on any later sweep either
    assert gateway.last_sweep.quarantined == 1
    gateway.close()

    status = cli("status", db=store_location)
    assert status.returncode == 0
    assert "QUARANTINED: 1" in status.stdout and poisoned in status.stdout
    data = json.loads(cli("status", "--json", db=store_location).stdout)
    assert (data["quarantined"], data["quarantined_ids"]) == (1, [poisoned])
    listed = cli("list", "--state", "quarantined", "--json", db=store_location)
    assert listed.returncode == 0
    assert [o["obligation_id"] for o in json.loads(listed.stdout)["obligations"]] == [poisoned]
    rebuilt = cli("projections", "rebuild", "--json", db=store_location)
    assert rebuilt.returncode == 0, rebuilt.stderr
    reports = json.loads(rebuilt.stdout)
    reports = reports.get("projections", reports) if isinstance(reports, dict) else reports
    assert all(r["equal"] for r in reports), reports
    audit = cli("audit", "duplicates", db=store_location)
    assert audit.returncode == 1, (audit.stdout, audit.stderr)
    assert "undecodable_event" in audit.stdout and poisoned in audit.stdout
    found = json.loads(cli("audit", "duplicates", "--json", db=store_location).stdout)
    (finding,) = found["findings"]
    assert (finding["kind"], finding["obligation_id"], finding["version"]) == (
        "undecodable_event",
        poisoned,
        bad_version,
    )
    assert reason in finding["detail"]
    history = cli("history", poisoned, db=store_location)  # one line, naming the event
    assert history.returncode == 2
    assert f"v{bad_version}" in history.stderr and reason in history.stderr
    assert len(history.stderr.strip().splitlines()) == 1
    metrics = cli("metrics", db=store_location)
    assert metrics.returncode == 0
    assert "gateway_ledger_quarantined_obligations 1.0\n" in metrics.stdout
    assert 'gateway_ledger_obligations{platform="telegram",state="quarantined"} 1.0' in (
        metrics.stdout
    )


def test_gateway_start_says_recovery_was_partial_and_logs_it_at_error(
    store_location: str, caplog: pytest.LogCaptureFixture
) -> None:
    flip_first_byte(store_location, deliver_one(store_location), 3)
    (owed,) = record_orphans(store_location, 1, prefix="owed")
    adapter = ScriptedAdapter("telegram")

    async def boot() -> Any:
        async with Gateway.open(store_location) as gateway:
            return await gateway.start([adapter])

    with caplog.at_level(logging.INFO):
        report = asyncio.run(boot())
    assert (report.claimed, report.redelivered) == (1, 1)
    assert (report.recovery, report.quarantined) == ("partial", 1)
    assert [s.content for s in adapter.sent] == [f"reply {owed}"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("PARTIAL recovery" in r.getMessage() for r in errors)


def test_gateway_start_says_recovery_did_not_run_when_the_sweep_cannot(
    sqlite_location: str, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3

    ledger = DeliveryLedger.open(sqlite_location)
    ledger.recoverable.catch_up()
    ledger.close()
    record_orphans(sqlite_location, 1, prefix="owed")
    with sqlite3.connect(sqlite_location) as conn:  # the view's table, damaged
        conn.execute("DROP TABLE recoverable_obligations")
        conn.execute("CREATE TABLE recoverable_obligations (aggregate_id TEXT PRIMARY KEY)")
    adapter = ScriptedAdapter("telegram")

    async def boot() -> Any:
        async with Gateway.open(sqlite_location) as gateway:
            return await gateway.start([adapter])

    with caplog.at_level(logging.INFO):
        report = asyncio.run(boot())
    assert (report.recovery, report.claimed) == ("not_run", 0)
    assert adapter.sent == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("WITHOUT recovery" in r.getMessage() for r in errors)


def test_clean_start_says_recovery_was_complete(store_location: str) -> None:
    record_orphans(store_location, 2, prefix="owed")
    adapter = ScriptedAdapter("telegram")

    async def boot() -> Any:
        async with Gateway.open(store_location) as gateway:
            return await gateway.start([adapter])

    report = asyncio.run(boot())
    assert (report.recovery, report.quarantined, report.redelivered) == ("complete", 0, 2)


CHILD = """
    import sys
    from gateway_ledger.bootstrap import DeliveryLedger
    ledger = DeliveryLedger.open(sys.argv[1])
    key = sys.argv[2]
    ledger.record_obligation(
        obligation_id="before", session_key=key, platform="telegram", chat_id="77",
        content="first reply",
    )
    print("ready", flush=True)
    sys.stdin.readline()  # the session is forgotten meanwhile; this process keeps its key
    try:
        ledger.record_obligation(
            obligation_id="after", session_key=key, platform="telegram", chat_id="77",
            content="reply written after the forget",
        )
    except Exception as e:
        print("refused", type(e).__name__, flush=True)
    else:
        print("recorded", flush=True)
    sys.stdin.readline()
"""


def test_reply_written_after_forget_with_a_cached_key_is_refused_and_never_sent(
    store_location: str,
) -> None:
    child = python_child(
        CHILD.replace("sys.argv[1]", repr(store_location)).replace("sys.argv[2]", repr(SESSION))
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready", child.stderr
        forget_session(store_location, SESSION)
        child.stdin.write("go\n")
        child.stdin.flush()
        outcome = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)  # the gateway dies with the reply owed
        child.wait(timeout=30)
    adapter = ScriptedAdapter("telegram")

    async def boot() -> Any:
        async with Gateway.open(store_location) as gateway:
            return await gateway.start([adapter])

    report = asyncio.run(boot())
    # The write under the destroyed key is refused in its transaction (ADR 0028), so
    # nothing is owed; the sweep's abandon of an erased reply has its own test below.
    assert outcome == ["refused", "SessionErased"], outcome
    assert adapter.sent == []  # no platform ever receives an erased placeholder
    assert report.redelivered == 0


def test_owed_reply_whose_key_is_gone_is_abandoned_erased_by_the_sweep(
    store_location: str,
) -> None:
    (owed, kept) = record_orphans(store_location, 2, prefix="owed")
    ledger = DeliveryLedger.open(store_location)
    keyring = ledger.private_mapper.keyring
    keyring.destroy(keyring.subject_id("agent:main:telegram:dm:0"))  # owed-00000's session
    ledger.close()

    gateway = DeliveryLedger.open(store_location)
    won = gateway.sweep_recoverable()
    assert [item["obligation_id"] for item in won] == [kept]
    assert gateway.last_sweep is not None and gateway.last_sweep.abandoned == {"erased": 1}
    status = gateway.get(owed)
    assert (status.state, status.abandon_reason) == ("abandoned", "erased")
    gateway.close()


def test_tampered_ciphertext_is_quarantined_never_sent_and_reported(store_location: str) -> None:
    tampered, kept = record_orphans(store_location, 2, prefix="owed")
    tamper_ciphertext(store_location, tampered)
    adapter = ScriptedAdapter("telegram")

    async def boot() -> Any:
        async with Gateway.open(store_location) as gateway:
            return await gateway.start([adapter])

    report = asyncio.run(boot())
    assert [s.content for s in adapter.sent] == [f"reply {kept}"]
    assert (report.recovery, report.quarantined) == ("partial", 1)

    ledger = DeliveryLedger.open(store_location)
    status = ledger.get(tampered)
    assert status.content == UNREADABLE and status.chat_id == UNREADABLE  # not "[erased]"
    assert [e.type for e in ledger.history(tampered)][-1] == "Quarantined"
    assert status.quarantine_reason == "unreadable"
    (entry,) = ledger.list(state="quarantined")
    assert (entry.obligation_id, entry.quarantine_reason) == (tampered, "unreadable")
    version = status.version
    assert ledger.sweep_recoverable() == []  # a later boot leaves it alone, appends nothing
    assert ledger.last_sweep is not None and ledger.last_sweep.quarantined == 1
    assert ledger.get(tampered).version == version
    ledger.close()

    audit = cli("audit", "duplicates", "--json", db=store_location)
    assert audit.returncode == 1
    (finding,) = json.loads(audit.stdout)["findings"]
    assert (finding["kind"], finding["obligation_id"]) == ("unreadable_fields", tampered)
    listed = cli("list", "--state", "quarantined", db=store_location)
    assert listed.returncode == 0 and tampered in listed.stdout and "unreadable" in listed.stdout
    history = cli("history", tampered, db=store_location)
    assert history.returncode == 0 and "QUARANTINED: unreadable" in history.stdout
    assert "reason=unreadable found_at=v1" in history.stdout


def test_a_quarantined_reply_is_never_retried_but_may_be_abandoned(store_location: str) -> None:
    (tampered,) = record_orphans(store_location, 1, prefix="owed")
    tamper_ciphertext(store_location, tampered)
    ledger = DeliveryLedger.open(store_location)
    assert ledger.sweep_recoverable() == []
    retried = cli("retry", tampered, db=store_location)
    assert retried.returncode == 2 and "quarantined" in retried.stderr
    assert cli("abandon", tampered, "--reason", "unreadable", db=store_location).returncode == 0
    assert ledger.get(tampered).state == "abandoned"
    assert ledger.stats().quarantined == 0
    ledger.close()


def test_unchanged_bytes_written_back_change_nothing(store_location: str) -> None:
    """The planting helpers themselves: writing a state back as it was is harmless."""
    oid = deliver_one(store_location)
    set_state(store_location, oid, 3, stored_state(store_location, oid, 3))
    ledger = DeliveryLedger.open(store_location)
    assert ledger.stats().quarantined == 0 and ledger.get(oid).state == "delivered"
    ledger.close()


@pytest.fixture(scope="module")
def template_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store with every kind of event: delivered, failed, claimed, abandoned, owed."""
    folder = tmp_path_factory.mktemp("template")
    location = str(folder / "ledger.db")
    ledger = DeliveryLedger.open(location)
    for n, ending in enumerate(("delivered", "failed", "abandoned")):
        oid = f"o-{ending}"
        ledger.record_obligation(
            obligation_id=oid,
            session_key=f"agent:main:telegram:dm:{n}",
            platform="telegram",
            chat_id=str(n),
            content=f"text {n}",
        )
        ledger.mark_attempting(oid)
        if ending == "delivered":
            ledger.mark_delivered(oid, ["m-1"])
        elif ending == "failed":
            ledger.mark_failed(oid, "timeout", "ambiguous")
        else:
            ledger.abandon(oid, "operator", "asked to")
    ledger.close()
    record_orphans(location, 2, prefix="owed")
    return folder


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    event=st.integers(min_value=0, max_value=10), at=st.integers(min_value=0), bit=st.integers(0, 7)
)
def test_any_flipped_bit_never_stops_a_reader_and_rebuild_equals_incremental(
    template_store: Path, tmp_path_factory: pytest.TempPathFactory, event: int, at: int, bit: int
) -> None:
    import shutil
    import sqlite3

    from gateway_ledger.application.delivery.audit import audit_duplicates
    from gateway_ledger.projections.delivery.catalog import PROJECTION_NAMES, rebuild_and_verify

    folder = tmp_path_factory.mktemp("flipped")
    for name in os.listdir(template_store):
        shutil.copy(template_store / name, folder / name)
    location = str(folder / "ledger.db")
    with sqlite3.connect(location) as conn:
        rows = conn.execute("SELECT rowid, state FROM stored_events ORDER BY rowid").fetchall()
        rowid, state = rows[event % len(rows)]
        flipped = bytearray(state)
        flipped[at % len(flipped)] ^= 1 << bit
        conn.execute("UPDATE stored_events SET state = ? WHERE rowid = ?", (bytes(flipped), rowid))

    ledger = DeliveryLedger.open(location)
    try:
        won = ledger.sweep_recoverable()  # never raises
        assert ledger.last_sweep is not None and ledger.last_sweep.errors == 0
        for item in won:  # what is handed to a sender was opened completely
            assert "[erased]" not in (item["content"], item["chat_id"])
            assert UNREADABLE not in (item["content"], item["chat_id"])
        stats = ledger.stats()
        assert stats.quarantined == len(stats.quarantined_ids)
        for name in PROJECTION_NAMES:
            assert rebuild_and_verify(ledger, name).equal
        report = audit_duplicates(ledger)
        undecodable = {f.obligation_id for f in report.findings if f.kind == "undecodable_event"}
        index_poisoned = {
            e.obligation_id
            for e in ledger.list(state="quarantined")
            if e.quarantine_reason != "unreadable"
        }
        assert undecodable == index_poisoned  # the audit and the views agree
    finally:
        ledger.close()


def test_dry_run_sweep_says_it_would_quarantine_and_appends_nothing(store_location: str) -> None:
    tampered, kept = record_orphans(store_location, 2, prefix="owed")
    tamper_ciphertext(store_location, tampered)
    preview = cli("sweep", "--dry-run", "--json", db=store_location)
    assert preview.returncode == 0, preview.stderr
    actions = {a["obligation_id"]: a for a in json.loads(preview.stdout)["actions"]}
    assert (actions[tampered]["action"], actions[tampered]["reason"]) == (
        "quarantine",
        "unreadable",
    )
    assert actions[kept]["action"] == "claim"
    ledger = DeliveryLedger.open(store_location)
    assert ledger.get(tampered).version == 1 and ledger.get(kept).version == 1
    ledger.close()


def test_a_value_postgresql_cannot_hold_is_quarantined_not_a_stopped_view(pg_url: str) -> None:
    """A NUL in a stored platform name (accepted by earlier releases) fails every view
    write on PostgreSQL: that obligation is quarantined, the rest recovered."""
    bad = deliver_one(pg_url, "nul-platform")
    (owed,) = record_orphans(pg_url, 1, prefix="owed")
    state = stored_state(pg_url, bad, 1)
    assert b'"platform":"telegram"' in state
    set_state(pg_url, bad, 1, state.replace(b'"platform":"telegram"', b'"platform":"tele\\u0000"'))

    ledger = DeliveryLedger.open(pg_url)
    assert [item["obligation_id"] for item in ledger.sweep_recoverable()] == [owed]
    stats = ledger.stats()
    assert (stats.quarantined, stats.quarantined_ids) == (1, (bad,))
    ledger.close()


def test_first_catch_up_of_a_store_written_in_clear_does_not_lock_itself(
    sqlite_location: str,
) -> None:
    """Naming a session from a clear event sets the keyring up, which writes: not inside
    the view's own transaction (found when the audit began catching the index up)."""
    ledger = DeliveryLedger.open(sqlite_location, encrypt=False)
    ledger.record_obligation(
        obligation_id="clear", session_key=SESSION, platform="telegram", chat_id="7", content="x"
    )
    ledger.close()
    done = cli("audit", "duplicates", db=sqlite_location)
    assert done.returncode == 0, done.stderr
    listed = json.loads(cli("list", "--json", db=sqlite_location).stdout)
    assert [o["obligation_id"] for o in listed["obligations"]] == ["clear"]


def test_forgetting_a_session_with_a_quarantined_reply_still_erases(store_location: str) -> None:
    poisoned = deliver_one(store_location)
    flip_first_byte(store_location, poisoned, 2)  # its Attempting: it may still be owed
    report = forget_session(store_location, SESSION)
    assert report.destroyed_keys
    ledger = DeliveryLedger.open(store_location)
    assert ledger.stats().quarantined_ids == (poisoned,)
    assert ledger.sweep_recoverable() == []
    ledger.close()


def test_views_made_by_an_earlier_release_gain_the_quarantine_columns(store_location: str) -> None:
    """A store whose views predate ADR 0027 opens, catches up and quarantines as usual."""
    (owed,) = record_orphans(store_location, 1, prefix="owed")
    ledger = DeliveryLedger.open(store_location)
    ledger.stats()  # both views made and caught up
    for view in (ledger.recoverable, ledger.obligation_index):
        with view.dialect.write_transaction() as c:  # as an earlier release left them
            for column in ("quarantine_reason", "quarantine_version"):
                c.execute(f"ALTER TABLE {view.table} DROP COLUMN {column}")
    ledger.close()
    flip_first_byte(store_location, deliver_one(store_location), 3)

    fresh = DeliveryLedger.open(store_location)
    assert [item["obligation_id"] for item in fresh.sweep_recoverable()] == [owed]
    assert fresh.stats().quarantined_ids == ("long-delivered",)
    fresh.close()


def test_an_owner_whose_tag_lost_its_shape_quarantines_only_its_obligation(
    store_location: str,
) -> None:
    """A flipped bit in ``"_data_"`` of a Delivered event's owner leaves valid JSON that the
    transcoder keeps as a plain dict (as it must for metadata that only looks like a tag).
    Found by the flipped-bit property: the audit crashed on it (an unhashable owner) while
    the views read the event as sound. Now it is undecodable for every reader alike."""
    (orphan,) = record_orphans(store_location, 1, prefix="shape")
    ledger = DeliveryLedger.open(store_location)
    try:
        bad = deliver_one_with(ledger, "shape-delivered")
        state = stored_state(store_location, bad, 3)
        assert b'"_type_":"OwnerIdentity","_data_"' in state
        set_state(
            store_location, bad, 3, state.replace(b'Identity","_data_"', b'Identity","^data_"')
        )
        won = ledger.sweep_recoverable()
        assert [item["obligation_id"] for item in won] == [orphan]
        assert ledger.last_sweep is not None and ledger.last_sweep.errors == 0
        assert ledger.stats().quarantined_ids == (bad,)
        report = ledger.audit_duplicates()
        assert [f.obligation_id for f in report.findings if f.kind == "undecodable_event"] == [bad]
    finally:
        ledger.close()


def deliver_one_with(ledger: DeliveryLedger, oid: str) -> str:
    ledger.record_obligation(
        obligation_id=oid, session_key="agent:main:x:dm:1", platform="x", chat_id="1", content="c"
    )
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid, ["m1"])
    return oid
