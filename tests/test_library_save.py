"""Our ``save`` and repository against the library's own (ADR 0067).

``PrivateEvents.save`` does what the library's ``Application.save`` does, with class
checks where the library asks runtime-checkable protocols, and the repository replays
with ``apply_in_order`` instead of ``project_aggregate``. These tests pin both to the
installed library: the steps of its ``save`` (by the names its code uses), what each way
stores (events, snapshots, notification ids, on real SQLite files), and the repository's
settings and replays.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.application import Application, LRUCache, project_aggregate

from gateway_ledger.bootstrap import SessionStore
from gateway_ledger.domain.sessions.route import SessionRoute
from gateway_ledger.domain.sessions.session import Session, format_session_id
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.infrastructure.eventstore.library import (
    AppliedInOrder,
    PrivateEvents,
    apply_in_order,
)

T0 = datetime(2026, 7, 20, tzinfo=UTC)


def test_the_library_save_still_takes_the_steps_ours_repeats() -> None:
    """Ours repeats: collect each object's events, ``events.put`` with the keywords, the
    cache, the snapshots due, and two notification hooks that do nothing in
    ``Application``. A library whose save does more fails here first."""
    assert Application.save.__code__.co_names == (
        "ProcessingEvent",
        "collect_events",
        "_record",
        "_take_snapshots",
        "_notify",
        "notify",
        "events",
    )
    assert set(Application._record.__code__.co_names) == {
        "events",
        "put",
        "tracking",
        "saved_kwargs",
        "repository",
        "cache",
        "fastforward",
        "aggregates",
        "items",
    }
    assert "take_snapshot" in Application._take_snapshots.__code__.co_names
    for hook in ("_notify", "notify"):  # no-ops in Application; none of ours overrides them
        assert getattr(SessionStore, hook) is getattr(Application, hook)
        assert hook not in vars(PrivateEvents)


def conversation(n: int, messages: int) -> list[Any]:
    """A session with ``messages`` messages and its route, the same on every call."""
    source = SessionSource(platform="telegram", chat_id=str(n), user_id=str(n))
    key = f"agent:main:telegram:dm:{n}"
    session = Session.start(
        session_id=format_session_id(T0, f"{n:08x}"), key=key, source=source, now=T0
    )
    for i in range(messages):
        session.append_message(role="user", content=f"message {i}", now=T0 + timedelta(i))
    return [SessionRoute.open(key=key, session_id=session.session_id, now=T0), session]


def stored_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """What a store holds, without the sealed bytes (their nonces differ per write)."""
    conn = sqlite3.connect(path)
    try:
        tables = [
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if name.startswith("stored_")  # stored_events, stored_snapshots
        ]
        # Events with their positions (rowid: the notification id); snapshots by version.
        position = {"stored_events": "rowid"}
        return {
            table: conn.execute(
                f"SELECT {position.get(table, 'NULL')}, originator_id, originator_version, "
                f"topic FROM {table} ORDER BY {position.get(table, 'originator_version')}, "
                "originator_id"
            ).fetchall()
            for table in tables
        }
    finally:
        conn.close()


def test_our_save_stores_what_the_library_save_stores(tmp_path: Path) -> None:
    """The same aggregates, saved through each, in new stores: the same events at the
    same positions, the same snapshots (every 20th version of a session or route), and
    the same recordings returned (``store``, which returns none, stores the same)."""
    results = {}
    for way in ("ours", "library", "store"):
        path = tmp_path / f"{way}.db"
        store = SessionStore.open(str(path))
        try:
            saved: list[list[Any]] = []
            for n, messages in enumerate((0, 3, 19, 45)):
                objects = conversation(n, messages)
                if way == "ours":
                    saved.append(store.save(*objects))
                elif way == "library":
                    saved.append(Application.save(store, *objects))
                else:  # the same write without Recordings (no notification ids asked)
                    store.store(*objects)
            recordings = [
                [
                    (
                        r.domain_event.originator_id,
                        r.domain_event.originator_version,
                        r.notification.id,
                        r.notification.topic,
                    )
                    for r in batch
                ]
                for batch in saved
            ]
            loaded = [vars(store.load_session(format_session_id(T0, f"{n:08x}"))) for n in range(4)]
        finally:
            store.close()
        results[way] = (stored_rows(path), recordings, loaded)
    ours, library, stored = results["ours"], results["library"], results["store"]
    assert ours == library
    assert (stored[0], stored[2]) == (ours[0], ours[2]) and stored[1] == []
    # Version 20 of the session of 19 messages, 20 and 40 of the one of 45.
    assert [v for _, _, v, _ in ours[0]["stored_snapshots"]] == [20, 20, 40]


def test_the_repository_is_the_librarys_replaying_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's settings, read from the environment as it reads them, and the same
    aggregate from a replay with or without the library's per-event protocol check."""
    monkeypatch.setenv("AGGREGATE_CACHE_MAXSIZE", "7")
    store = SessionStore.open(str(tmp_path / "s.db"))
    try:
        ours = store.repository
        assert isinstance(ours, AppliedInOrder)
        assert vars(ours).keys() == vars(Application.construct_repository(store)).keys()
        assert isinstance(ours.cache, LRUCache) and ours.cache.maxsize == 7
        assert ours.event_store is store.events and ours.snapshot_store is store.snapshots
        route, session = conversation(1, 25)
        store.save(route, session)
        for version in (None, 3, 21, 26):
            replayed = ours.get(session.id, version=version, deepcopy_from_cache=False)
            checked = ours.get(session.id, version=version, projector_func=project_aggregate)
            assert vars(replayed) == vars(checked)
        assert apply_in_order(None, []) is None
    finally:
        store.close()
