"""Events that outlive their code (ADR 0055), on SQLite and PostgreSQL.

``DeliveryObligation.Abandoned`` gained ``error_class`` at class version 2, with an
upcaster from version 1; ``Erasure.SubjectErased`` was renamed ``SubjectForgotten``, its
former topic registered as an alias. Old events are replayed through the chain: rows
rewritten to the old shape, and the 0.1.0 golden store itself.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson
import pytest

from gateway_ledger.application.privacy.erasure import erasures
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.privacy.erasure import Erasure
from gateway_ledger.projections.delivery.obligation_index import IndexQuery
from tests.operator_support import owner, record
from tests.quarantine_support import set_state, stored_state

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import golden_stores as gs

OLD = gs.GOLDEN_DIR / "0.1.0-2026-12-01"
FORMER = "gateway_ledger.domain.erasure:Erasure.SubjectErased"


def test_abandoned_is_written_at_version_2_and_a_version_1_event_is_upcast(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_300_001))
    record(ledger, "gave-up")
    ledger.mark_attempting("gave-up")
    ledger.mark_failed("gave-up", "blocked", classification="dead_target")
    ledger.abandon("gave-up", reason="dead_target")
    state = orjson.loads(stored_state(store_location, "gave-up", 4))
    assert state["class_version"] == 2 and state["error_class"] == "dead_target"
    (abandoned,) = [e for e in ledger.events.get(ledger.aggregate_id("gave-up"))][-1:]
    assert isinstance(abandoned, DeliveryObligation.Abandoned)
    assert abandoned.error_class == "dead_target"

    # The same event as 0.1.0 wrote it: no class_version, no error_class.
    del state["class_version"], state["error_class"]
    set_state(store_location, "gave-up", 4, orjson.dumps(state))
    ledger.decrypted.clear()
    old = list(ledger.events.get(ledger.aggregate_id("gave-up")))[-1]
    assert type(old) is DeliveryObligation.Abandoned and old.error_class is None
    assert ledger.get("gave-up").state == "abandoned"
    for view in (ledger.recoverable, ledger.obligation_index):
        assert view.rebuild_and_verify().equal
    ledger.close()


def golden_copy(backend: str, tmp_path: Path, pg_url: str | None) -> str:
    """The 0.1.0 store, as SQLite copy or loaded into a fresh PostgreSQL schema."""
    if backend == "sqlite":
        db = tmp_path / gs.MAIN_STORE
        shutil.copyfile(OLD / gs.MAIN_STORE, db)
        db.chmod(0o600)
        gs.place_key_files(OLD, tmp_path)
        return str(db)
    assert pg_url is not None
    gs.load_into_postgres(OLD / gs.rows_file(gs.MAIN_STORE), pg_url)
    return pg_url


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres"])
def test_the_0_1_0_store_replays_through_the_upcaster_and_the_alias(
    backend_name: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pg_url = request.getfixturevalue("pg_url") if backend_name == "postgres" else None
    for name, value in gs.command_environment(
        gs.postgres_secrets(OLD, tmp_path) if pg_url else None
    ).items():
        monkeypatch.setenv(name, value)
    location = golden_copy(backend_name, tmp_path, pg_url)
    ledger = DeliveryLedger.open(location, existing=True)
    try:
        found = erasures(ledger)  # stored under the former topic
        assert found and all(isinstance(e, Erasure) for e in found)
        assert all(e.subject_id for e in found)
        ledger.obligation_index.catch_up()
        abandoned = [
            event
            for entry in ledger.obligation_index.entries(IndexQuery(state="abandoned"))
            for event in ledger.events.get(ledger.aggregate_id(entry.obligation_id))
            if isinstance(event, DeliveryObligation.Abandoned)
        ]
        assert abandoned and all(e.error_class is None for e in abandoned)  # upcast from v1
        rows = ledger.recorder.select_notifications(0, 10_000, topics=[FORMER])
        assert rows  # the old events are still stored as they were written
        for view in (ledger.recoverable, ledger.obligation_index):
            assert view.rebuild_and_verify().equal
    finally:
        ledger.close()
