"""Bad bytes planted straight into the event store with SQL, as bit rot, a tampering
hand or a newer release would leave them (ADR 0027), through the simulator's
:class:`EventTable`, by obligation id."""

from __future__ import annotations

import orjson

from gateway_ledger.domain.delivery.obligation import obligation_uuid
from gateway_ledger.entrypoints.simulation.faults import EventTable

NEWER_TOPIC = "gateway_ledger.domain.obligation:DeliveryObligation.Snoozed"
"""An event type a later release might add; this one does not know it."""


def events(location: str) -> EventTable:
    postgres = location.startswith("postgresql://")
    return EventTable(location, "gateway_ledger_events" if postgres else "stored_events")


def stored_state(location: str, obligation_id: str, version: int) -> bytes:
    return events(location).state(obligation_uuid(obligation_id), version)


def set_state(location: str, obligation_id: str, version: int, state: bytes) -> None:
    events(location).set_state(obligation_uuid(obligation_id), version, state)


def flip_first_byte(location: str, obligation_id: str, version: int) -> None:
    events(location).flip_first_byte(obligation_uuid(obligation_id), version)


def tamper_ciphertext(location: str, obligation_id: str, version: int = 1) -> None:
    events(location).tamper_ciphertext(obligation_uuid(obligation_id), version)


def append_newer_event(location: str, obligation_id: str, version: int) -> None:
    """An event of a type this release does not know, as a newer gateway would write it."""
    state = orjson.dumps(
        {
            "timestamp": {"_type_": "datetime_iso", "_data_": "2026-06-01T12:00:00+00:00"},
            "until": "2026-06-02T12:00:00+00:00",
        }
    )
    events(location).insert(obligation_uuid(obligation_id), version, NEWER_TOPIC, state)
