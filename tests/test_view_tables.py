"""A view's tables at a process's first use: what is missing is added, and what exists is
left alone, without the locks that would queue behind a reader (``sql_dialect.py``)."""

from __future__ import annotations

import threading

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url


def index_names(ledger: DeliveryLedger) -> set[str]:
    view = ledger.recoverable
    with view.dialect.read_cursor() as c:
        if view.dialect.name == "postgres":
            c.execute(
                "SELECT indexname AS name FROM pg_indexes WHERE schemaname = %s",
                (view.dialect.datastore.schema,),
            )
        else:
            c.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        return {str(row["name"]) for row in c.fetchall()}


def test_a_view_index_dropped_is_made_again_at_the_next_first_use(store_location: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    ledger.stats()  # both views made
    index = "recoverable_obligations_by_recorded_at"
    assert index in index_names(ledger)
    dialect = ledger.recoverable.dialect
    with dialect.write_transaction() as c:
        c.execute(f"DROP INDEX {dialect.table(index)}")  # an index is named as a table is
    assert index not in index_names(ledger)
    ledger.close()

    fresh = DeliveryLedger.open(store_location)
    fresh.stats()
    assert index in index_names(fresh)
    fresh.close()


def test_a_views_first_use_does_not_wait_behind_a_reader_of_it(pg_url: str) -> None:
    """An operator's long read of the view holds a share lock on it. A gateway that starts
    meanwhile checks the view's tables: it must not ask for a lock that waits behind that
    read (``ALTER TABLE`` and ``CREATE INDEX`` do, even with nothing to do), or every other
    reader of the view would queue behind it."""
    ledger = DeliveryLedger.open(pg_url)
    ledger.stats()  # both views made, with every column and index
    table = ledger.recoverable.table
    ledger.close()
    reader = connect(parse_postgres_url(pg_url))
    try:
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {table}").fetchone()  # holds its share lock
        fresh = DeliveryLedger.open(pg_url)
        done = threading.Event()

        def first_use() -> None:
            fresh.stats()
            done.set()

        thread = threading.Thread(target=first_use, daemon=True)
        thread.start()
        finished = done.wait(20)
        reader.execute("ROLLBACK")  # lets a waiting first use go on either way
        thread.join(30)
        fresh.close()
        assert finished, "the view's first use waited behind a reader of the view"
    finally:
        reader.close()
