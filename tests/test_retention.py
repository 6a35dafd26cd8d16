"""``prune``: resolved obligations leave the hot store for an archive, a tombstone stays
(ADR 0053), on SQLite and PostgreSQL.

A property: whatever the histories and whenever prunes run, nothing unresolved is
pruned, a rebuild of each view equals the incremental view, and recording a pruned id
again appends nothing. Then the console script end to end: prune, status, history and
audit with ``--archive``, verify.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recovery_support import dead_owner

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.domain.values import AbandonReason, DeliveryTarget, ErrorClass
from gateway_ledger.infrastructure.eventstore.archive import archived_streams
from tests.operator_support import owner, record
from tests.quarantine_support import append_newer_event

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
OWNERS = [dead_owner() for _ in range(2)]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


step = st.one_of(
    st.tuples(st.just("record"), st.integers(0, 3)),
    st.tuples(st.just("attempt"), st.integers(0, 3)),
    st.tuples(st.just("deliver"), st.integers(0, 3)),
    st.tuples(st.just("fail"), st.integers(0, 3)),
    st.tuples(st.just("abandon"), st.integers(0, 3)),
    st.tuples(st.just("prune"), st.integers(0, 30)),
    st.tuples(st.just("catch_up"), st.integers(0, 3)),
)


def apply(ledger: DeliveryLedger, oid: str, kind: str, now: datetime) -> None:
    if kind == "record":
        if not ledger.exists(oid) and not ledger.was_pruned(oid):
            ledger.save(
                DeliveryObligation.record(
                    obligation_id=oid,
                    session_key="agent:main:telegram:dm:1",
                    target=DeliveryTarget(platform="telegram", chat_id="1"),
                    content="x",
                    owner=OWNERS[0],
                    now=now,
                )
            )
        return
    if not ledger.exists(oid):
        return
    agg = ledger.load(oid)
    try:
        if kind == "attempt":
            agg.start_attempt(by=agg.owner, now=now)
        elif kind == "deliver":
            agg.confirm_delivery(by=agg.owner, now=now, receipt=["r"])
        elif kind == "fail":
            agg.fail(by=agg.owner, now=now, error="e", classification=ErrorClass.AMBIGUOUS)
        elif kind == "abandon":
            agg.abandon(reason=AbandonReason.OPERATOR, now=now, detail="stop")
    except IllegalTransition:
        return
    ledger.save(agg)


def test_prune_keeps_what_is_owed_and_the_views_equal_their_rebuild(
    store_location: str, tmp_path: Path
) -> None:
    clock = Clock()
    ledger = DeliveryLedger.open(store_location, clock=clock, owner=OWNERS[1])
    archive = str(tmp_path / "archive.jsonl.gz")

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(steps=st.lists(step, min_size=4, max_size=30), batch=st.integers(1, 4))
    def prop(steps: list[tuple[str, int]], batch: int) -> None:
        prefix = uuid.uuid4().hex[:8]
        ids = [f"{prefix}-{i}" for i in range(4)]
        for n, (kind, arg) in enumerate(steps):
            clock.now = T0 + timedelta(minutes=n)
            if kind == "prune":
                before = {oid: ledger.get(oid).state for oid in ids if ledger.exists(oid)}
                report = ledger.prune(timedelta(minutes=arg), archive=archive, batch_size=batch)
                assert report.pruned >= 0
                for oid, state in before.items():
                    if not ledger.exists(oid):
                        assert state in ("delivered", "abandoned"), (oid, state)
                        assert ledger.was_pruned(oid)
            elif kind == "catch_up":
                ledger.obligation_index.catch_up()
            else:
                apply(ledger, ids[arg], kind, clock.now)
        for oid in ids:
            if ledger.was_pruned(oid):
                stone = ledger.tombstone(oid)
                assert stone is not None and stone.state in ("delivered", "abandoned")
                again = ledger.record_obligation(
                    obligation_id=oid,
                    session_key="agent:main:telegram:dm:1",
                    platform="telegram",
                    chat_id="1",
                    content="another reply entirely",
                )
                assert again == oid and not ledger.exists(oid)  # nothing appended
        for view in (ledger.recoverable, ledger.obligation_index):
            report = view.rebuild_and_verify()
            assert report.equal, (view.name, report.differences)

    try:
        prop()
    finally:
        ledger.close()


def test_an_event_type_this_release_does_not_know_is_never_pruned(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_200_001))
    for oid in ("known", "newer"):
        record(ledger, oid)
        ledger.mark_attempting(oid)
        ledger.mark_delivered(oid)
    record(ledger, "owed")
    append_newer_event(store_location, "newer", 4)  # a newer release moved it on
    record(ledger, "last")  # the newest event (SQLite keeps the stream holding it)
    report = ledger.prune(timedelta(0), archive=None if "postgresql" not in store_location
                          else "/tmp/unused-archive.jsonl.gz", batch_size=10)  # fmt: skip
    assert report.pruned == 1 and ledger.was_pruned("known")
    assert ledger.recorder.select_events(ledger.aggregate_id("newer"), limit=1)  # kept
    assert ledger.exists("owed") and not ledger.was_pruned("newer")
    ledger.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_prune_through_the_console_script(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ledger = DeliveryLedger.open(db, owner=owner(9_200_002))
    for n in range(6):
        record(ledger, f"o-{n}")
        ledger.mark_attempting(f"o-{n}")
        if n < 4:
            ledger.mark_delivered(f"o-{n}", receipt=["m"])
    ledger.abandon("o-4", reason="operator", detail="wrong chat")
    record(ledger, "owed")  # unresolved, and the newest
    ledger.close()

    dry = json.loads(
        cli("prune", "--older-than", "0s", "--dry-run", "--db", str(db), "--json").stdout
    )
    assert dry["candidates"] == 5 and dry["pruned"] == 0 and dry["dry_run"]
    done = cli("prune", "--older-than", "0s", "--db", str(db), "--batch", "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["pruned"] == 5 and report["by_state"] == {"delivered": 4, "abandoned": 1}
    assert report["batches"] == 3
    archive = Path(report["archive"])
    assert archive == Path(f"{db}.archive.jsonl.gz") and archive.stat().st_mode & 0o777 == 0o600
    assert {s.obligation_id for s in archived_streams(archive).values()} == {
        f"o-{n}" for n in range(5)
    }

    status = json.loads(cli("status", "--db", str(db), "--json").stdout)
    assert (status["total"], status["unresolved"], status["pruned"]) == (2, 2, 5)
    gone = cli("history", "o-1", "--db", str(db))
    assert gone.returncode == 2 and "pruned" in gone.stderr and str(archive) in gone.stderr
    old = json.loads(
        cli("history", "o-1", "--db", str(db), "--archive", str(archive), "--json").stdout
    )
    assert old["status"]["state"] == "delivered"
    assert [e["type"] for e in old["history"]] == ["Recorded", "Attempting", "Delivered"]
    audit = json.loads(cli("audit", "duplicates", "--db", str(db), "--json").stdout)
    assert audit["obligations"] == 2 and audit["covers"]["pruned_obligations"] == 5
    audit = json.loads(
        cli("audit", "duplicates", "--db", str(db), "--archive", str(archive), "--json").stdout
    )
    assert audit["obligations"] == 7 and audit["ok"]
    assert cli("verify", "--db", str(db)).returncode == 0
    rebuilt = cli("projections", "rebuild", "--db", str(db), "--json")
    assert rebuilt.returncode == 0, rebuilt.stdout
    bad = cli("prune", "--older-than", "soon", "--db", str(db))
    assert bad.returncode == 2 and "age" in bad.stderr


def test_prune_on_postgres_needs_an_archive(pg_url: str) -> None:
    ledger = DeliveryLedger.open(pg_url, owner=owner(9_200_003))
    try:
        with pytest.raises(Exception, match="archive"):
            ledger.prune(timedelta(0))
    finally:
        ledger.close()


def test_old_tombstones_can_be_forgotten(store_location: str, tmp_path: Path) -> None:
    clock = Clock()
    ledger = DeliveryLedger.open(store_location, clock=clock, owner=owner(9_200_004))
    archive = str(tmp_path / "a.jsonl.gz")
    for n in range(3):
        record(ledger, f"t-{n}")
        ledger.mark_attempting(f"t-{n}")
        ledger.mark_delivered(f"t-{n}")
    record(ledger, "newest")
    clock.now = T0 + timedelta(days=10)
    assert ledger.prune(timedelta(days=7), archive=archive).pruned == 3
    clock.now = T0 + timedelta(days=20)
    kept = ledger.prune(
        timedelta(days=7), archive=archive, forget_tombstones_older_than=timedelta(days=30)
    )
    assert kept.tombstones_forgotten == 0 and ledger.was_pruned("t-0")
    clock.now = T0 + timedelta(days=50)
    gone = ledger.prune(
        timedelta(days=7), archive=archive, forget_tombstones_older_than=timedelta(days=30)
    )
    assert gone.tombstones_forgotten == 3 and not ledger.was_pruned("t-0")
    ledger.close()
