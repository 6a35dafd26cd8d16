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

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
from eventsourcing.application import Application

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import (
    QUARANTINED,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
)
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.infrastructure.privacy.private_mapper import Undecodable
from gateway_ledger.projections.delivery.obligation_view import (
    QUARANTINE_COLUMNS,
    STILL_READ,
    ObligationView,
)

VIEW_NAME = "recoverable_obligations"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_micros(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the epoch: exact and sortable."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


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
    def from_row(cls, row: Mapping[str, Any]) -> RecoverableEntry:
        start_time = row["owner_start_time"]
        return cls(
            obligation_id=row["obligation_id"],
            aggregate_id=row["aggregate_id"],
            state=row["state"],
            platform=row["platform"],
            owner=OwnerIdentity(
                host=row["owner_host"],
                boot_id=row["owner_boot_id"],
                pid=int(row["owner_pid"]),
                start_time=None if start_time is None else int(start_time),
                installation_id=row["owner_installation_id"],
            ),
            recovery_attempts=int(row["recovery_attempts"]),
            recorded_at=from_micros(row["recorded_at"]),
            last_transition_at=from_micros(row["last_transition_at"]),
            version=int(row["version"]),
        )


_COLUMNS = (
    "aggregate_id, obligation_id, state, platform, owner_host, owner_boot_id, owner_pid, "
    "owner_start_time, owner_installation_id, recovery_attempts, recorded_at, "
    "last_transition_at, version"
)

_OWNER_MOVES = {
    "Attempting": ObligationState.ATTEMPTING,
    "Claimed": ObligationState.CLAIMED,
    "RetryRequested": ObligationState.PENDING,  # an operator's retry: claimable at once
}
_STATE_ONLY = {"Failed": ObligationState.FAILED}
_LEAVES = {"Delivered", "Abandoned"}


def _owner_params(owner: OwnerIdentity) -> tuple[Any, ...]:
    return (owner.host, owner.boot_id, owner.pid, owner.start_time, owner.installation_id)


class RecoverableObligations(ObligationView):
    """The unresolved obligations: the recovery sweep's index of candidates."""

    reads_personal_data = False
    """It indexes states, owners and times: the runner decodes its events without
    decrypting them (no data key is read, no text is held)."""

    def __init__(self, app: Application[Any], name: str = VIEW_NAME) -> None:
        super().__init__(app, name)

    # -- the Projection protocol ------------------------------------------------------------

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            "aggregate_id TEXT PRIMARY KEY, "
            "obligation_id TEXT NOT NULL, "
            "state TEXT NOT NULL, "
            "platform TEXT NOT NULL, "
            "owner_host TEXT NOT NULL, "
            "owner_boot_id TEXT NOT NULL, "
            "owner_pid BIGINT NOT NULL, "
            "owner_start_time BIGINT, "
            "owner_installation_id TEXT NOT NULL, "
            "recovery_attempts INTEGER NOT NULL, "
            "recorded_at BIGINT NOT NULL, "
            "last_transition_at BIGINT NOT NULL, "
            "version BIGINT NOT NULL, "
            "quarantine_reason TEXT, "
            "quarantine_version BIGINT)"
        )
        dialect.add_missing_columns(cursor, self.name, QUARANTINE_COLUMNS)
        index = f"{self.name}_by_recorded_at"
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {index} ON {self.table} (recorded_at, obligation_id)"
        )

    def apply(self, cursor: Cursor, dialect: SqlDialect, fact: object) -> None:
        if not isinstance(fact, DeliveryObligation.Event):
            return  # another aggregate's event: not ours to index
        event: Any = fact  # its fields depend on its type, dispatched on below
        kind = type(event).__name__
        aggregate_id = event.originator_id.hex
        version = event.originator_version
        moment = to_micros(event.timestamp)
        sql = dialect.sql
        if kind == "Recorded":
            values = (
                aggregate_id,
                event.obligation_id,
                ObligationState.PENDING.value,
                event.target.platform,
                *_owner_params(event.owner),
                0,
                moment,
                moment,
                version,
            )
            cursor.execute(
                sql(
                    f"INSERT INTO {self.table} ({_COLUMNS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (aggregate_id) DO NOTHING"
                ),
                values,
            )
        elif kind in _LEAVES:
            cursor.execute(
                sql(f"DELETE FROM {self.table} WHERE aggregate_id = ? AND {STILL_READ}"),
                (aggregate_id,),
            )
        elif kind == "Quarantined":
            # Not claimable any more, but still owed: it stays, so every sweep counts it.
            cursor.execute(
                sql(
                    f"UPDATE {self.table} SET state = ?, owner_host = ?, owner_boot_id = ?, "
                    "owner_pid = ?, owner_start_time = ?, owner_installation_id = ?, "
                    "quarantine_reason = ?, quarantine_version = ?, "
                    f"last_transition_at = ?, version = ? WHERE aggregate_id = ? AND {STILL_READ}"
                ),
                (
                    QUARANTINED,
                    *_owner_params(event.by),
                    QuarantineReason(event.reason).value,
                    int(event.found_at),
                    moment,
                    version,
                    aggregate_id,
                ),
            )
        elif kind in _OWNER_MOVES:
            attempts = 0 if kind == "RetryRequested" else getattr(event, "recovery_attempt", None)
            cursor.execute(
                sql(
                    f"UPDATE {self.table} SET state = ?, owner_host = ?, owner_boot_id = ?, "
                    "owner_pid = ?, owner_start_time = ?, owner_installation_id = ?, "
                    "recovery_attempts = COALESCE(?, recovery_attempts), "
                    f"last_transition_at = ?, version = ? WHERE aggregate_id = ? AND {STILL_READ}"
                ),
                (
                    _OWNER_MOVES[kind].value,
                    *_owner_params(event.by),
                    attempts,
                    moment,
                    version,
                    aggregate_id,
                ),
            )
        else:
            # Failed changes the state; an event type this view does not know (added
            # later) still moves the version, so the row never claims to be newer.
            state = _STATE_ONLY.get(kind)
            cursor.execute(
                sql(
                    f"UPDATE {self.table} SET state = COALESCE(?, state), "
                    f"last_transition_at = ?, version = ? WHERE aggregate_id = ? AND {STILL_READ}"
                ),
                (state.value if state else None, moment, version, aggregate_id),
            )

    def quarantine_row(self, bad: Undecodable) -> dict[str, Any]:
        return {
            "obligation_id": bad.obligation_id or bad.originator_id.hex,
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

    # -- use --------------------------------------------------------------------------------

    def entries(self) -> list[RecoverableEntry]:
        """Every unresolved obligation, oldest first (the upstream sweep order)."""
        self.runner.ensure_tables()
        with self.dialect.read_cursor() as c:
            c.execute(f"SELECT {_COLUMNS} FROM {self.table} ORDER BY recorded_at, obligation_id")
            return [RecoverableEntry.from_row(row) for row in c.fetchall()]
