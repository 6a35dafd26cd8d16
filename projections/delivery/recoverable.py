"""RecoverableObligations: the index of every obligation that is still owed.

One row per unresolved obligation (pending, attempting, failed, claimed) with what a
recovery sweep needs to choose candidates without loading aggregates: state, platform,
owner identity, recovery attempts, when it was recorded and last changed, and the
aggregate version the row reflects. Delivered and abandoned obligations leave the view,
so its size follows the work outstanding, never the history.

The view is only an index: it may lag the event store, and the sweep always reloads the
aggregate and lets it decide (ADR 0007). It can be rebuilt from the events at any time.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.delivery.reconciliation import PlatformStatus
from gateway_ledger.domain.values import QUARANTINED, ObligationState, OwnerIdentity
from gateway_ledger.projections.delivery.obligation_view import (
    ObligationProjection,
    from_micros,
    to_micros,
)
from gateway_ledger.projections.rows import Delete, Insert, RowChange, Value
from gateway_ledger.projections.view import MaterializedView

__all__ = [
    "VIEW_NAME",
    "RecoverableEntry",
    "RecoverableProjection",
    "RecoverableView",
    "from_micros",
    "to_micros",
]

VIEW_NAME = "recoverable_obligations"


@attrs.frozen
class RecoverableEntry:
    """One row of the view: an unresolved obligation, as of ``version``."""

    obligation_id: str
    aggregate_id: str
    state: str
    platform: str
    owner: OwnerIdentity
    recovery_attempts: int
    recorded_at: datetime
    last_transition_at: datetime
    version: int

    @property
    def is_quarantined(self) -> bool:
        return self.state == QUARANTINED

    @classmethod
    def from_row(
        cls, row: Mapping[str, Any], owners: dict[tuple[Any, ...], OwnerIdentity] | None = None
    ) -> RecoverableEntry:
        """One row as an entry; ``owners`` shares one identity per owner among the rows
        read together (a dead gateway's orphans have one owner: built and checked once)."""
        columns = (
            row["owner_host"],
            row["owner_boot_id"],
            row["owner_pid"],
            row["owner_start_time"],
            row["owner_installation_id"],
        )
        owner = None if owners is None else owners.get(columns)
        if owner is None:
            host, boot_id, pid, start_time, installation_id = columns
            owner = OwnerIdentity(
                host=host,
                boot_id=boot_id,
                pid=int(pid),
                start_time=None if start_time is None else int(start_time),
                installation_id=installation_id,
            )
            if owners is not None:
                owners[columns] = owner
        return cls(
            obligation_id=row["obligation_id"],
            aggregate_id=row["aggregate_id"],
            state=row["state"],
            platform=row["platform"],
            owner=owner,
            recovery_attempts=int(row["recovery_attempts"]),
            recorded_at=from_micros(row["recorded_at"]),
            last_transition_at=from_micros(row["last_transition_at"]),
            version=int(row["version"]),
        )


def owner_values(owner: OwnerIdentity) -> dict[str, Value]:
    """The owner columns: the whole identity, which the sweep compares with its own."""
    return {
        "owner_host": owner.host,
        "owner_boot_id": owner.boot_id,
        "owner_pid": owner.pid,
        "owner_start_time": owner.start_time,
        "owner_installation_id": owner.installation_id,
    }


class RecoverableProjection(ObligationProjection):
    """The unresolved obligations: the recovery sweep's index of candidates."""

    placeholders = {
        "platform": "",
        "owner_host": "unknown",  # its events do not say (never read: it is not claimed)
        "owner_boot_id": "",
        "owner_pid": 0,
        "owner_start_time": None,
        "owner_installation_id": "",
        "recovery_attempts": 0,
        "recorded_at": 0,
        "last_transition_at": 0,
    }

    def __init__(self, name: str = VIEW_NAME) -> None:
        super().__init__(name)

    def recorded(self, event: DeliveryObligation.Recorded) -> RowChange:
        moment = to_micros(event.timestamp)
        values = owner_values(event.owner)
        values["obligation_id"] = event.obligation_id
        values["state"] = ObligationState.PENDING.value
        values["platform"] = event.target.platform
        values["recovery_attempts"] = 0
        values["recorded_at"] = moment
        values["last_transition_at"] = moment
        values["version"] = event.originator_version
        return Insert(event.originator_id.hex, values)

    def attempting(self, event: DeliveryObligation.Attempting) -> RowChange:
        values = owner_values(event.by)
        values["state"] = ObligationState.ATTEMPTING.value
        return self.update(event, values)

    def claimed(self, event: DeliveryObligation.Claimed) -> RowChange:
        values = owner_values(event.by)
        values["state"] = ObligationState.CLAIMED.value
        values["recovery_attempts"] = event.recovery_attempt
        return self.update(event, values)

    def retry_requested(self, event: DeliveryObligation.RetryRequested) -> RowChange:
        """An operator's retry: claimable at once, with a fresh recovery budget."""
        values = owner_values(event.by)
        values["state"] = ObligationState.PENDING.value
        values["recovery_attempts"] = 0
        return self.update(event, values)

    def dead_letter_retried(self, event: DeliveryObligation.DeadLetterRetried) -> RowChange:
        """A dead letter owed again: back in the view (it left when it was abandoned),
        from the row facts the event carries."""
        values = owner_values(event.by)
        values["obligation_id"] = event.obligation_id
        values["state"] = ObligationState.PENDING.value
        values["platform"] = event.platform
        values["recovery_attempts"] = 0
        values["recorded_at"] = to_micros(event.recorded_at)
        values["last_transition_at"] = to_micros(event.timestamp)
        values["version"] = event.originator_version
        return Insert(event.originator_id.hex, values)

    def failed(self, event: DeliveryObligation.Failed) -> RowChange:
        return self.update(event, {"state": ObligationState.FAILED.value})

    def resolved(self, event: DeliveryObligation.Event) -> RowChange:
        """Delivered or abandoned: no longer owed, so it leaves the view."""
        return Delete(event.originator_id.hex)

    def status_reported(self, event: DeliveryObligation.StatusReported) -> RowChange:
        """A failure after acceptance reopens a delivered obligation: owed again, it comes
        back (other statuses change nothing a sweep reads)."""
        if event.status != PlatformStatus.FAILED_AFTER_ACCEPTANCE:
            return self.moved(event)
        values = owner_values(event.owner)
        values["obligation_id"] = event.obligation_id
        values["state"] = ObligationState.FAILED.value
        values["platform"] = event.platform
        values["recovery_attempts"] = event.recovery_attempts
        values["recorded_at"] = to_micros(event.recorded_at)
        values["last_transition_at"] = to_micros(event.timestamp)
        values["version"] = event.originator_version
        return Insert(event.originator_id.hex, values)

    def quarantined_fact(self, event: DeliveryObligation.Quarantined) -> RowChange:
        """Not claimable any more, but still owed: it stays, so every sweep counts it."""
        return self.update(event, {**self.quarantined(event), **owner_values(event.by)})

    handlers = {
        DeliveryObligation.Recorded: recorded,
        DeliveryObligation.Attempting: attempting,
        DeliveryObligation.Claimed: claimed,
        DeliveryObligation.RetryRequested: retry_requested,
        DeliveryObligation.DeadLetterRetried: dead_letter_retried,
        DeliveryObligation.Failed: failed,
        DeliveryObligation.Delivered: resolved,
        DeliveryObligation.Abandoned: resolved,
        DeliveryObligation.Quarantined: quarantined_fact,
        DeliveryObligation.StatusReported: status_reported,
    }


class RecoverableView(MaterializedView):
    """The recoverable obligations, as the sweep reads them (the port)."""

    @abstractmethod
    def entries(self) -> list[RecoverableEntry]:
        """Every unresolved obligation, oldest first (the upstream sweep order)."""
