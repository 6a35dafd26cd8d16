"""Opening a fresh SQLite file while another connection holds it: WAL is set, nothing fails."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.store import ensure_wal


def test_wal_switch_waits_for_an_exclusive_holder(tmp_path: Path) -> None:
    db = tmp_path / "fresh.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")  # a rollback-journal file, as a new store starts
    holder.execute("BEGIN EXCLUSIVE")
    released = threading.Event()

    def release() -> None:
        time.sleep(0.3)
        holder.execute("COMMIT")
        released.set()

    threading.Thread(target=release).start()
    ensure_wal(db, busy_timeout=5)
    assert released.is_set()  # it waited for the holder instead of failing
    mode = sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    holder.close()


def test_a_ledger_opened_on_a_fresh_file_is_in_wal_mode(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "ledger.db")
    with ledger.recorder.datastore.transaction(commit=False) as c:
        c.execute("PRAGMA journal_mode")
        assert c.fetchone()[0] == "wal"
    ledger.close()
