"""Owed replies brought from an existing installation's ledger, with their history as far
as its row tells it.

Upstream keeps one row per obligation and only its current state (hermes-formats.md §1.2,
§4). Each row becomes: ``Recorded`` at its ``created_at``, owned by the process that wrote
or last claimed it; the ``Imported`` fact (what the row said, and how its times were
read); and the transitions the state implies, at its ``updated_at``. A row that may have
been sent (any state but ``pending``, or attempts spent: upstream's claims leave the state
as it was) gets an ``Attempting``, so the sweep that recovers it sends with the marker. A
``failed`` row failed ambiguously (upstream did not say how). A row that spent upstream's
three attempts is abandoned (``max_attempts``), as upstream's next sweep would have.

The owner keeps its pid and start fingerprint, on this host and boot: while the old
gateway still runs on this machine its rows are its own; once it is gone (or on another
host, where the pid is not that process) the next sweep recovers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs
from eventsourcing.persistence import IntegrityError

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import InvalidInput, LedgerError
from gateway_ledger.domain.values import (
    AbandonReason,
    DeliveryTarget,
    ErrorClass,
    ObligationState,
    OwnerIdentity,
)

UPSTREAM_MAX_ATTEMPTS = 3
EPOCH_BASIS = "epoch seconds (UTC)"
"""Upstream's ledger times are ``time.time()`` floats: no zone to choose."""


@attrs.frozen
class ImportedRow:
    """One row of upstream's ``delivery_obligations`` table."""

    obligation_id: str
    session_key: str
    platform: str
    chat_id: str
    thread_id: str | None
    content: str
    state: str
    attempts: int
    created_at: float
    updated_at: float
    owner_pid: int | None
    owner_started_at: int | None
    last_error: str | None


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def imported_obligation(
    row: ImportedRow, *, host: str, boot_id: str, source: str, now: datetime
) -> DeliveryObligation:
    """The obligation ``row`` becomes (not saved); InvalidInput for a row a live ledger
    would refuse (its state unknown, its fields invalid)."""
    try:
        state = ObligationState(row.state)
    except ValueError:
        raise InvalidInput(f"unknown state {row.state!r}") from None
    owner = OwnerIdentity(
        host=host,
        boot_id=boot_id,
        pid=max(int(row.owner_pid or 0), 0),
        start_time=row.owner_started_at,
        installation_id=source,
    )
    try:
        target = DeliveryTarget(platform=row.platform, chat_id=row.chat_id, thread_id=row.thread_id)
    except TypeError as e:
        raise InvalidInput(str(e)) from None
    created, updated = at(row.created_at), at(max(row.updated_at, row.created_at))
    obligation = DeliveryObligation.record(
        obligation_id=row.obligation_id,
        session_key=row.session_key,
        target=target,
        content=row.content,
        owner=owner,
        now=created,
    )
    obligation.note_import(
        source=source,
        source_state=state.value,
        attempts=row.attempts,
        last_error=row.last_error or "",
        created_at=row.created_at,
        updated_at=row.updated_at,
        time_basis=EPOCH_BASIS,
        now=created,
    )
    possibly_sent = state is not ObligationState.PENDING or row.attempts > 0
    if possibly_sent:
        obligation.start_attempt(by=owner, now=updated)
    if state is ObligationState.DELIVERED:
        obligation.confirm_delivery(by=owner, now=updated)
    elif state is ObligationState.FAILED:
        obligation.fail(
            by=owner, now=updated, error=row.last_error or "", classification=ErrorClass.AMBIGUOUS
        )
    if state is ObligationState.ABANDONED or (
        not obligation.is_resolved and row.attempts >= UPSTREAM_MAX_ATTEMPTS
    ):
        reason = (
            AbandonReason.MAX_ATTEMPTS
            if row.attempts >= UPSTREAM_MAX_ATTEMPTS
            else AbandonReason.STALE
        )
        obligation.abandon(reason=reason, now=updated, detail=row.last_error or "")
    return obligation


class ImportingLedger(Protocol):
    """What importing needs of the ledger: whether an id is held, and its write path."""

    def exists(self, obligation_id: str) -> bool: ...

    def save(self, *aggregates: Any) -> Any: ...


@attrs.frozen
class RowsImported:
    imported: tuple[str, ...]
    already_present: int
    refused: tuple[tuple[str, str], ...]
    """(obligation id, why) for each row a live ledger would refuse: nothing of it written."""


BATCH = 500


def import_rows(
    ledger: ImportingLedger,
    rows: Sequence[ImportedRow],
    *,
    host: str,
    boot_id: str,
    source: str,
    now: datetime,
    dry_run: bool = False,
) -> RowsImported:
    """Write each row the ledger does not hold yet, in batches (one transaction each; one
    by one when a batch meets an id written meanwhile). A second run finds every id held
    and writes nothing."""
    present = 0
    refused: list[tuple[str, str]] = []
    built: list[DeliveryObligation] = []
    for row in rows:
        try:
            if ledger.exists(row.obligation_id):
                present += 1
                continue
            built.append(
                imported_obligation(row, host=host, boot_id=boot_id, source=source, now=now)
            )
        except LedgerError as e:
            refused.append((str(row.obligation_id), str(e)))
    done: list[str] = []
    for start in range(0, 0 if dry_run else len(built), BATCH):
        batch = built[start : start + BATCH]
        try:
            ledger.save(*batch)
            done.extend(o.obligation_id for o in batch)
        except IntegrityError:
            for obligation in batch:
                try:
                    ledger.save(obligation)
                    done.append(obligation.obligation_id)
                except IntegrityError:
                    present += 1
    if dry_run:
        done = [o.obligation_id for o in built]
    return RowsImported(tuple(done), present, tuple(refused))
