"""A paused gateway process cannot hand the platform an unlabelled copy after a claim.

Real processes, real signals, real PostgreSQL (ADR 0032). The child delivers a two-part
reply; it is SIGSTOPped inside the (slow) first part, past its lease; this test claims
the reply through the public sweep, as another gateway would, and records its re-send.
While the child resumes, the events table is held locked for a moment, so the child's
write of part 0 times out (the ledger deadline) instead of conflicting: before the fix
it took that as leave to go on, and handed part two to the platform, plain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from eventsourcing.persistence import PersistenceError
from psycopg import sql

from gateway_ledger.application.delivery.gateway import DEFAULT_LEDGER_DEADLINE
from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from gateway_ledger.infrastructure.ownership.leases import LeaseSettings
from gateway_ledger.infrastructure.ownership.liveness import LeaseLiveness

CHILD = str(Path(__file__).with_name("fencing_child.py"))
TTL, RENEW, SKEW = 1.0, 0.2, 0.2
DEADLINE = DEFAULT_LEDGER_DEADLINE


def journal_lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_paused_gateway_hands_no_unmarked_part_to_the_platform_after_a_claim(
    pg_url: str, tmp_path: Path
) -> None:
    journal = tmp_path / "platform.jsonl"
    env = dict(os.environ)
    env.update(
        {
            "GATEWAY_LEDGER_HOST": "host-paused",
            "GATEWAY_LEDGER_INSTALLATION_ID": "inst-paused",
            "GATEWAY_LEDGER_LEASE_TTL": str(TTL),
            "GATEWAY_LEDGER_LEASE_RENEW": str(RENEW),
            "GATEWAY_LEDGER_CLOCK_SKEW": str(SKEW),
        }
    )
    child = subprocess.Popen(
        [sys.executable, CHILD, pg_url, str(journal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    claimer = DeliveryLedger.open(
        pg_url, lease=LeaseSettings(ttl=TTL, renew_every=RENEW, clock_skew=SKEW)
    )
    lock = connect(parse_postgres_url(pg_url))
    try:
        deadline = time.monotonic() + 30
        while not journal_lines(journal):  # part one is on its way (slow platform)
            assert child.poll() is None, child.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the child never sent"
            time.sleep(0.02)
        child.send_signal(signal.SIGSTOP)
        claimer.recoverable.catch_up()
        [owed] = claimer.recoverable.entries()  # recorded before its first send
        assert owed.owner.host == "host-paused"
        assert claimer.leases is not None
        alive = LeaseLiveness(claimer.leases, clock_skew=SKEW)
        while alive(owed.owner):
            assert time.monotonic() < deadline, "the paused child's lease never expired"
            time.sleep(0.05)
        [won] = claimer.sweep_recoverable()  # the public sweep claims it...
        assert won["needs_marker"] is True
        claimer.mark_delivered(won["obligation_id"], ["claimer-1", "claimer-2"])  # ...re-sent
        sent_before = len(journal_lines(journal))

        # The child's next write will wait for this lock longer than its ledger deadline.
        schema = parse_postgres_url(pg_url)["schema"]
        lock.autocommit = False
        lock.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                sql.Identifier(schema, "gateway_ledger_events")
            )
        )
        child.send_signal(signal.SIGCONT)
        time.sleep(DEADLINE + 1.0)
        lock.commit()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
        lock.close()
        claimer.close()

    after_resume = journal_lines(journal)[sent_before:]
    unmarked = [e for e in after_resume if not str(e["text"]).startswith(DUPLICATE_NOTICE)]
    assert unmarked == [], (after_resume, err)
    assert json.loads(out.strip().splitlines()[-1])["status"] in ("superseded", "delivered")


def test_a_transaction_left_open_by_a_stopped_holder_is_ended_by_the_server(
    pg_url: str,
) -> None:
    """A holder stopped inside a transaction (here: one that just stops talking, which is
    the same to the server) keeps its locks only half a lease ttl: the server rolls it
    back and closes the session, other writers go on, and the holder's next statement
    fails (a store error, which the gateway counts as a ledger fault)."""
    settings = LeaseSettings(ttl=2.0, renew_every=0.5, clock_skew=0.5)
    holder = DeliveryLedger.open(pg_url, lease=settings)
    other = DeliveryLedger.open(pg_url, lease=settings)
    schema = parse_postgres_url(pg_url)["schema"]
    waited: dict[str, float] = {}

    def record() -> None:
        other.record_obligation(
            obligation_id="o-1",
            session_key="agent:main:telegram:dm:1",
            platform="telegram",
            chat_id="1",
            content="hello",
        )
        waited["seconds"] = time.monotonic() - started

    try:
        with (
            pytest.raises(PersistenceError, match="idle-in-transaction"),
            holder.recorder.datastore.get_connection() as conn,
            conn.transaction(),
        ):
            shown = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
            assert shown is not None and list(dict(shown).values()) == ["1s"]  # ttl / 2
            conn.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                    sql.Identifier(schema, "gateway_ledger_events")
                )
            )
            started = time.monotonic()
            writer = threading.Thread(target=record)
            writer.start()
            writer.join(timeout=30)
            conn.execute("SELECT 1")  # resumed: its transaction is gone
    finally:
        holder.close()
    assert waited["seconds"] < 3.0  # not the library's 5 s, nor forever
    assert other.exists("o-1")
    other.close()
