"""Bad bytes planted straight into the event store with SQL, as bit rot, a tampering
hand or a newer release would leave them (ADR 0027)."""

from __future__ import annotations

import base64
import sqlite3
from typing import Any

import orjson

from gateway_ledger.domain.obligation import obligation_uuid

NEWER_TOPIC = "gateway_ledger.domain.obligation:DeliveryObligation.Snoozed"
"""An event type a later release might add; this one does not know it."""


def _postgres(location: str) -> tuple[Any, str]:
    from gateway_ledger.infrastructure.postgres import connect, parse_postgres_url

    params = parse_postgres_url(location)
    return connect(params), f'"{params["schema"]}".gateway_ledger_events'


def stored_state(location: str, obligation_id: str, version: int) -> bytes:
    aggregate = obligation_uuid(obligation_id)
    if location.startswith("postgresql://"):
        conn, table = _postgres(location)
        with conn:
            row = conn.execute(
                f"SELECT state FROM {table} WHERE originator_id = %s AND originator_version = %s",
                (aggregate, version),
            ).fetchone()
        return bytes(row[0])
    with sqlite3.connect(location) as conn:
        row = conn.execute(
            "SELECT state FROM stored_events WHERE originator_id = ? AND originator_version = ?",
            (aggregate.hex, version),
        ).fetchone()
    return bytes(row[0])


def set_state(location: str, obligation_id: str, version: int, state: bytes) -> None:
    aggregate = obligation_uuid(obligation_id)
    if location.startswith("postgresql://"):
        conn, table = _postgres(location)
        with conn:
            done = conn.execute(
                f"UPDATE {table} SET state = %s "
                "WHERE originator_id = %s AND originator_version = %s",
                (state, aggregate, version),
            )
            assert done.rowcount == 1
        return
    conn = sqlite3.connect(location)
    try:
        done = conn.execute(
            "UPDATE stored_events SET state = ? WHERE originator_id = ? AND originator_version = ?",
            (state, aggregate.hex, version),
        )
        assert done.rowcount == 1
        conn.commit()
    finally:
        conn.close()


def flip_first_byte(location: str, obligation_id: str, version: int) -> None:
    """One bit of the stored event's first byte flipped: ``{`` becomes ``z``."""
    state = bytearray(stored_state(location, obligation_id, version))
    state[0] ^= 0x01
    set_state(location, obligation_id, version, bytes(state))


def tamper_ciphertext(location: str, obligation_id: str, version: int = 1) -> None:
    """One bit of the sealed fields' ciphertext flipped (still valid base64 and JSON)."""
    state = orjson.loads(stored_state(location, obligation_id, version))
    blob = bytearray(base64.b64decode(state["_sealed_"]["c"]))
    blob[20] ^= 0x01
    state["_sealed_"]["c"] = base64.b64encode(bytes(blob)).decode()
    set_state(location, obligation_id, version, orjson.dumps(state))


def append_newer_event(location: str, obligation_id: str, version: int) -> None:
    """An event of a type this release does not know, as a newer gateway would write it."""
    aggregate = obligation_uuid(obligation_id)
    state = orjson.dumps(
        {
            "timestamp": {"_type_": "datetime_iso", "_data_": "2026-06-01T12:00:00+00:00"},
            "until": "2026-06-02T12:00:00+00:00",
        }
    )
    if location.startswith("postgresql://"):
        conn, table = _postgres(location)
        with conn:
            conn.execute(
                f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
                "VALUES (%s, %s, %s, %s)",
                (aggregate, version, NEWER_TOPIC, state),
            )
        return
    conn = sqlite3.connect(location)
    try:
        conn.execute(
            "INSERT INTO stored_events (originator_id, originator_version, topic, state) "
            "VALUES (?, ?, ?, ?)",
            (aggregate.hex, version, NEWER_TOPIC, state),
        )
        conn.commit()
    finally:
        conn.close()
