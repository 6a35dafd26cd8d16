"""A store written by a newer release is detected at open, on both stores (ADR 0054):
read-only commands go on (and say so), writers are refused naming both releases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway_ledger import bootstrap
from gateway_ledger.bootstrap import DeliveryLedger, Gateway
from gateway_ledger.infrastructure.eventstore.release import (
    NewerStore,
    record_release,
    running_release,
    stored_release,
)
from gateway_ledger.infrastructure.eventstore.sql_dialect import dialect_for
from gateway_ledger.infrastructure.eventstore.store import store_environment, store_path
from tests.operator_support import owner, record

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


def release_of(location: str) -> str | None:
    env = store_environment(location, existing=True)
    return stored_release(env, store_path(env))


def test_a_writer_notes_its_release_and_never_lowers_it(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_100_001))
    record(ledger, "r-1")
    assert release_of(store_location) == running_release() == "0.5.0"
    record_release(dialect_for(ledger.recorder), "0.1.5")  # an older writer
    assert release_of(store_location) == "0.5.0"
    ledger.close()


def test_a_newer_store_is_read_only_for_readers_and_refused_to_writers(
    store_location: str, tmp_path: Path
) -> None:
    ledger = DeliveryLedger.open(store_location, owner=owner(9_100_002))
    record(ledger, "r-1")
    ledger.stats()  # the views are built, as any running store has them
    record_release(dialect_for(ledger.recorder), "9.1.0")
    ledger.close()

    with pytest.raises(NewerStore) as refused:
        DeliveryLedger.open(store_location, owner=owner(9_100_003))
    assert "9.1.0" in str(refused.value) and running_release() in str(refused.value)
    with pytest.raises(NewerStore):
        Gateway.open(store_location, owner=owner(9_100_004))
    with pytest.raises(NewerStore):
        bootstrap.open_ledger(store_location, existing=True, writing=True)

    reader = bootstrap.open_ledger(store_location, existing=True)
    try:
        assert reader.read_only
        assert reader.get("r-1").state == "pending"
    finally:
        reader.close()

    env = dict(os.environ)
    status = subprocess.run(
        [SCRIPT, "status", "--db", store_location], capture_output=True, text=True, env=env
    )
    assert status.returncode == 0, status.stderr
    assert "9.1.0" in status.stderr and "read-only" in status.stderr
    retry = subprocess.run(
        [SCRIPT, "retry", "r-1", "--db", store_location], capture_output=True, text=True, env=env
    )
    assert retry.returncode == 2
    assert "9.1.0" in retry.stderr and running_release() in retry.stderr


def test_the_running_release_is_the_projects_version() -> None:
    """One version: the code's own constant is pyproject.toml's, so a store's marker
    names the release that was built (read without the installed package's metadata)."""
    import tomllib

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert running_release() == project["project"]["version"]
