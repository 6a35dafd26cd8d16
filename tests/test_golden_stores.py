"""Every release's golden store, opened by the code at hand, gives the answers it gave.

A folder under tests/golden/ is what one release wrote (tools/make_golden_store.py) and
what its console script answered on it. It is never regenerated: this test is how the
project proves it can still read what it wrote, on SQLite (the committed file, copied) and
on PostgreSQL (the same rows loaded into a fresh schema). tests/golden/README.md says more.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import drop_postgres_schema

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import golden_stores as gs

RELEASES = sorted(p for p in gs.GOLDEN_DIR.iterdir() if p.is_dir())


@pytest.fixture(params=RELEASES, ids=[p.name for p in RELEASES])
def release(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy of the release folder: the committed files are never opened for writing."""
    source: Path = request.param
    copy = tmp_path / "golden" / source.name
    shutil.copytree(source, copy)
    return copy


def frozen(folder: Path) -> dict[str, Any]:
    answers: dict[str, Any] = orjson.loads((folder / gs.ANSWERS_FILE).read_bytes())
    return answers


def stored_topics(folder: Path) -> set[str]:
    return {
        line["row"]["topic"]
        for store in gs.STORES
        for line in gs.read_rows(folder / gs.rows_file(store))
        if line["table"] == "stored_events"
    }


def as_answered(got: Any, want: Any) -> Any:
    """``got`` restricted to the fields ``want`` has, at every depth: a later release may
    answer with more fields (``status`` gained ``dead_letters``), never with other values
    in the fields an earlier release answered."""
    if isinstance(got, dict) and isinstance(want, dict):
        return {k: as_answered(got[k], want[k]) if k in got else got.get(k) for k in want}
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [as_answered(g, w) for g, w in zip(got, want, strict=True)]
    return got


def assert_same_answers(got: dict[str, Any], want: dict[str, Any]) -> None:
    for store in gs.STORES:
        assert set(got[store]) == set(want[store]), store
        for question, answer in want[store].items():
            assert as_answered(got[store][question], answer) == answer, f"{store}: {question}"


def test_a_later_release_may_add_fields_but_not_change_them() -> None:
    want = {"json": {"total": 2, "rows": [{"a": 1}]}}
    assert as_answered({"json": {"total": 2, "new": 1, "rows": [{"a": 1, "b": 2}]}}, want) == want
    assert as_answered({"json": {"total": 3, "rows": [{"a": 1}]}}, want) != want
    assert as_answered({"json": {"rows": [{"a": 1}]}}, want) != want  # a field gone


def test_golden_store_answers_on_sqlite(release: Path, tmp_path: Path) -> None:
    got = gs.take_answers(release, tmp_path / "sqlite", backend="sqlite")
    assert_same_answers(got, frozen(release))


def test_golden_store_answers_on_postgres(
    release: Path, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = gs.postgres_secrets(release, tmp_path)
    for name, value in gs.command_environment(secrets).items():
        monkeypatch.setenv(name, value)
    raw_url = gs.schema_url(pg_url, gs.RAW_STORE)
    try:
        for store in gs.STORES:
            counts = gs.load_into_postgres(
                release / gs.rows_file(store), gs.schema_url(pg_url, store)
            )
            assert sum(counts.values()) == len(gs.read_rows(release / gs.rows_file(store)))
        got = gs.take_answers(release, tmp_path / "pg", backend="postgres", pg_url=pg_url)
    finally:
        drop_postgres_schema(raw_url)
    assert_same_answers(got, frozen(release))


def test_golden_rows_are_the_sqlite_stores_rows(release: Path, tmp_path: Path) -> None:
    """What PostgreSQL is loaded with is exactly what the release wrote into SQLite."""
    for store in gs.STORES:
        exported = tmp_path / gs.rows_file(store)
        gs.export_rows(release / store, exported)
        assert exported.read_bytes() == (release / gs.rows_file(store)).read_bytes(), store


def test_golden_store_holds_every_event_type_of_its_release(release: Path) -> None:
    recorded = frozen(release)["release_topics"]
    assert recorded, "the release's own list of event types is recorded"
    assert set(recorded) <= stored_topics(release)


def test_every_event_type_of_this_release_is_in_a_golden_store() -> None:
    """A new event type needs a new golden store that holds it, not a silent gap."""
    stored = set().union(*(stored_topics(folder) for folder in RELEASES))
    missing = sorted(set(gs.release_topics()) - stored)
    assert not missing, (
        f"no golden store holds {missing}: run tools/make_golden_store.py <version>-<date>"
    )


def test_the_normaliser_replaces_only_what_varies() -> None:
    answer = {
        "elapsed_seconds": 0.25,
        "position": 120,
        "rows": 15,
        "path": "/tmp/x/store.db is read-only",
        "nested": [{"generated_at": "2026-12-01T15:00:00+00:00", "state": "delivered"}],
    }
    assert gs.normalise(answer, "/tmp/x/store.db") == {
        "elapsed_seconds": gs.VARIES,
        "position": gs.VARIES,
        "rows": 15,
        "path": "<store> is read-only",
        "nested": [{"generated_at": gs.VARIES, "state": "delivered"}],
    }
