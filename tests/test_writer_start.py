"""A constructed group-commit writer starts nothing; its first write starts its thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter


def writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gateway-ledger-writer")]


def test_a_writer_starts_its_thread_on_the_first_write_and_stops_it_on_close(
    tmp_path: Path,
) -> None:
    ledger = DeliveryLedger.open(tmp_path / "w.db", encrypt=False)
    try:
        before = writer_threads()
        writer = GroupCommitWriter(ledger)
        assert writer_threads() == before  # the constructor started nothing
        obligation = ledger.new_obligation(
            obligation_id="o-1", session_key="s", platform="telegram", chat_id="1", content="x"
        )
        asyncio.run(writer.write(obligation.collect_events(), label="o-1"))
        assert len(writer_threads()) == len(before) + 1
        assert ledger.get("o-1").state == "pending"
        writer.close()
        assert writer_threads() == before
    finally:
        ledger.close()


def test_a_writer_never_written_to_closes_without_a_thread(tmp_path: Path) -> None:
    ledger = DeliveryLedger.open(tmp_path / "w.db", encrypt=False)
    try:
        before = writer_threads()
        GroupCommitWriter(ledger).close()
        assert writer_threads() == before
    finally:
        ledger.close()
