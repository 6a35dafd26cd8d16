"""One write path: every write reaches the recorder through the application's event store,
carrying the data keys it sealed with explicitly (``insert_events(..., keys=WriteKeys)``).

The synchronous API, the library's ``Application.save``, operators' commands and the
gateway's group-commit writer all end in one ``SealedEventStore`` write; no thread-local state
and no override of the library's private methods carries anything between them. On
PostgreSQL the keys reach the recorder's ``_insert_events`` hook, the one library internal
the write path relies on: pinned here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.eventstore.library import SealedEventStore
from gateway_ledger.infrastructure.eventstore.postgres import (
    KeyedPostgresApplicationRecorder,
    postgres_environment,
)
from gateway_ledger.infrastructure.privacy.key_table import KEYS_TABLE
from gateway_ledger.infrastructure.privacy.keyring import WriteKeys

ROOT = Path(__file__).resolve().parent.parent
KEY = "agent:main:telegram:dm:77"


def record(ledger: DeliveryLedger, oid: str, key: str = KEY) -> None:
    ledger.record_obligation(
        obligation_id=oid, session_key=key, platform="telegram", chat_id="77", content="hi"
    )


def test_every_write_reaches_the_recorder_with_the_keys_it_sealed_with(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location)
    assert isinstance(ledger.events, SealedEventStore)
    seen: list[tuple[int, Any]] = []
    insert = ledger.recorder.insert_events

    def watched(stored_events: Sequence[StoredEvent], **kwargs: Any) -> Any:
        seen.append((len(stored_events), kwargs.get("keys")))
        return insert(stored_events, **kwargs)

    ledger.recorder.insert_events = watched  # type: ignore[method-assign]
    record(ledger, "o-sync")  # the synchronous API: a new subject's key
    ledger.mark_attempting("o-sync")
    ledger.mark_failed("o-sync", "HTTP 503", "rejected")
    ledger.retry("o-sync", by_operator="ops")  # an operator's command
    saved = ledger.new_obligation(
        obligation_id="o-saved", session_key=KEY, platform="telegram", chat_id="77", content="x"
    )
    ledger.save(saved)  # the library's Application.save
    writer = GroupCommitWriter(ledger)  # the gateway's path
    batch = ledger.new_obligation(
        obligation_id="o-writer", session_key="agent:main:telegram:dm:78", platform="telegram",
        chat_id="78", content="y",
    )  # fmt: skip
    writer.submit(batch.collect_events()).result(timeout=30)
    writer.close()
    assert [n for n, _ in seen] == [1, 1, 1, 1, 1, 1]
    assert all(isinstance(keys, WriteKeys) for _, keys in seen)
    first, *_, last = (keys for _, keys in seen)
    assert len(first.rows) == 1 and len(last.rows) == 1  # each new subject's key, once
    assert all(not keys.rows for _, keys in seen[1:-1])
    assert seen[1][1].used == {}  # Attempting seals nothing
    subject = ledger.private_mapper.keyring.subject_id(KEY)
    assert seen[2][1].used == {subject: first.rows[0][1]}  # Failed's error, under that key
    reader = DeliveryLedger.open(store_location)
    assert reader.history("o-sync")[2].fields["error"] == "HTTP 503"
    assert reader.get("o-writer").state == "pending"
    for opened in (ledger, reader):
        opened.close()


def test_nothing_in_the_write_path_is_carried_by_thread_locals_or_private_overrides() -> None:
    """What a write does is in one place: no thread-local hand-off between the mapping and
    the recorder, and none of the library's private methods overridden (but the
    PostgreSQL recorder hook, owned by postgres.py, see tests/test_architecture.py)."""
    sources = [
        p
        for layer in ("application", "infrastructure", "projections", "domain", "entrypoints")
        for p in (ROOT / layer).rglob("*.py")
    ]
    assert len(sources) > 80
    found = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if "threading.local" in text or "import local" in text:
            found.append(f"{path.relative_to(ROOT)}: threading.local")
        for name in re.findall(r"def (_record|_insert_events|_take_snapshots|_notify)\(", text):
            if path != ROOT / "infrastructure/eventstore/postgres.py" or name != "_insert_events":
                found.append(f"{path.relative_to(ROOT)}: overrides {name}")
    assert found == []


# -- the library internal the write path uses: PostgreSQL's recorder hook --------------------


class ProbingRecorder(KeyedPostgresApplicationRecorder):
    """Notes what the library hands the hook, and the transaction it runs in."""

    calls: list[tuple[dict[str, Any], int]] = []
    fail_next = False

    def _insert_events(
        self, curs: Any, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        super()._insert_events(curs, stored_events, **kwargs)
        curs.execute("SELECT txid_current() AS tx")
        (row,) = curs.fetchall()
        type(self).calls.append((dict(kwargs), int(row["tx"])))
        if type(self).fail_next:
            type(self).fail_next = False
            raise RuntimeError("refused by the hook")


def test_the_library_runs_the_postgres_hook_with_save_kwargs_in_the_events_transaction(
    pg_url: str,
) -> None:
    """eventsourcing's ``PostgresApplicationRecorder.insert_events`` calls
    ``_insert_events(curs, stored_events, **kwargs)`` inside the transaction that inserts
    the events, before them: the write's key rows commit (or roll back) with its events."""
    env = {
        **postgres_environment(pg_url),
        "APPLICATION_RECORDER_TOPIC": get_topic(ProbingRecorder),
    }
    ProbingRecorder.calls = []
    ledger = DeliveryLedger(env)
    assert isinstance(ledger.recorder, ProbingRecorder) and ledger.recorder.stores_keys
    record(ledger, "o-1")
    ((kwargs, tx),) = ProbingRecorder.calls
    keys = kwargs["keys"]
    assert isinstance(keys, WriteKeys) and len(keys.rows) == 1
    schema = ledger.recorder.datastore.schema
    with ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute(
            f'SELECT xmin::text AS x FROM "{schema}".{ledger.recorder.events_table_name} '
            "WHERE originator_id = %s",
            (ledger.aggregate_id("o-1"),),
        )
        (event,) = c.fetchall()
        c.execute(f'SELECT xmin::text AS x FROM "{schema}".{KEYS_TABLE}')
        (key,) = c.fetchall()
    assert int(event["x"]) == int(key["x"]) == tx

    ProbingRecorder.fail_next = True  # the hook fails: neither key row nor events stored
    with pytest.raises(RuntimeError, match="refused by the hook"):
        record(ledger, "o-2", key="agent:main:telegram:dm:79")
    assert not ledger.exists("o-2")
    with ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute(f'SELECT count(*) AS n FROM "{schema}".{KEYS_TABLE}')
        assert c.fetchone()["n"] == 1
    ledger.close()
