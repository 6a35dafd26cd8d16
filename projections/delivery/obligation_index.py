"""ObligationIndex: one row per obligation, for operators' status, list and metrics.

Unlike the recoverable view, resolved obligations stay (with when they were delivered
or why they were abandoned), so ``status`` and ``list`` read this table and never replay
history. A row holds no personal data: the session appears only as its keyed subject id
(the same name the privacy keyring uses), never as the session key or chat id.

The marker columns follow the aggregate's own rule (ADR 0006): ``may_have_arrived`` is
raised by every send and lowered only by a failure the platform says did not arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs
from eventsourcing.application import Application

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import (
    QUARANTINED,
    ErrorClass,
    ObligationState,
    QuarantineReason,
)
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED, Undecodable
from gateway_ledger.projections.delivery.obligation_view import (
    QUARANTINE_COLUMNS,
    STILL_READ,
    ObligationView,
)
from gateway_ledger.projections.delivery.recoverable import from_micros, to_micros

INDEX_NAME = "obligation_index"

COLUMNS = (
    "aggregate_id",
    "obligation_id",
    "state",
    "platform",
    "subject_id",
    "owner_host",
    "owner_pid",
    "recorded_at",
    "last_transition_at",
    "delivered_at",
    "send_attempts",
    "claims",
    "recovery_attempts",
    "retries",
    "fence",
    "may_have_arrived",
    "arrived_before",
    "error_class",
    "abandon_reason",
    "version",
    "quarantine_reason",
    "quarantine_version",
)


@attrs.frozen
class IndexEntry:
    """One obligation as operators see it: facts, no personal data."""

    obligation_id: str
    state: str
    platform: str
    subject_id: str
    owner_host: str
    owner_pid: int
    recorded_at: datetime
    last_transition_at: datetime
    delivered_at: datetime | None
    send_attempts: int
    claims: int
    recovery_attempts: int
    retries: int
    fence: int
    needs_marker: bool
    error_class: str | None
    abandon_reason: str | None
    version: int
    quarantine_reason: str | None = None
    quarantine_version: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> IndexEntry:
        delivered = row["delivered_at"]
        return cls(
            obligation_id=row["obligation_id"],
            state=row["state"],
            platform=row["platform"],
            subject_id=row["subject_id"],
            owner_host=row["owner_host"],
            owner_pid=int(row["owner_pid"]),
            recorded_at=from_micros(row["recorded_at"]),
            last_transition_at=from_micros(row["last_transition_at"]),
            delivered_at=None if delivered is None else from_micros(delivered),
            send_attempts=int(row["send_attempts"]),
            claims=int(row["claims"]),
            recovery_attempts=int(row["recovery_attempts"]),
            retries=int(row["retries"]),
            fence=int(row["fence"]),
            needs_marker=bool(row["may_have_arrived"]),
            error_class=row["error_class"],
            abandon_reason=row["abandon_reason"],
            version=int(row["version"]),
            quarantine_reason=row["quarantine_reason"],
            quarantine_version=(
                None if row["quarantine_version"] is None else int(row["quarantine_version"])
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for name in ("recorded_at", "last_transition_at", "delivered_at"):
            value = data[name]
            data[name] = None if value is None else value.isoformat()
        return data


_SIMPLE_STATE = {
    "Delivered": ObligationState.DELIVERED,
    "Abandoned": ObligationState.ABANDONED,
}


class ObligationIndex(ObligationView):
    """One row per obligation, for status, listing and metrics without replaying history."""

    reads_personal_data = False
    """A session is indexed by its keyed subject id, which a sealed event names in clear:
    the runner decodes its events without decrypting them (ADR 0021)."""

    def __init__(self, app: Application[Any], name: str = INDEX_NAME) -> None:
        super().__init__(app, name)

    # -- the Projection protocol ------------------------------------------------------------

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            "aggregate_id TEXT PRIMARY KEY, "
            "obligation_id TEXT NOT NULL, "
            "state TEXT NOT NULL, "
            "platform TEXT NOT NULL, "
            "subject_id TEXT NOT NULL, "
            "owner_host TEXT NOT NULL, "
            "owner_pid BIGINT NOT NULL, "
            "recorded_at BIGINT NOT NULL, "
            "last_transition_at BIGINT NOT NULL, "
            "delivered_at BIGINT, "
            "send_attempts INTEGER NOT NULL, "
            "claims INTEGER NOT NULL, "
            "recovery_attempts INTEGER NOT NULL, "
            "retries INTEGER NOT NULL, "
            "fence INTEGER NOT NULL, "
            "may_have_arrived INTEGER NOT NULL, "
            "arrived_before INTEGER NOT NULL, "
            "error_class TEXT, "
            "abandon_reason TEXT, "
            "version BIGINT NOT NULL, "
            "quarantine_reason TEXT, "
            "quarantine_version BIGINT)"
        )
        dialect.add_missing_columns(cursor, self.name, QUARANTINE_COLUMNS)
        for suffix, columns in (
            ("by_state", "state, recorded_at"),
            ("by_subject", "subject_id, recorded_at"),
            ("by_recorded_at", "recorded_at"),
        ):
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {self.name}_{suffix} ON {self.table} ({columns})"
            )

    def apply(self, cursor: Cursor, dialect: SqlDialect, fact: object) -> None:
        if not isinstance(fact, DeliveryObligation.Event):
            return
        event: Any = fact
        kind = type(event).__name__
        key = event.originator_id.hex
        moment = to_micros(event.timestamp)
        version = event.originator_version
        sql = dialect.sql
        if kind == "Recorded":
            values = (
                key,
                event.obligation_id,
                ObligationState.PENDING.value,
                event.target.platform,
                self._subject(event),
                event.owner.host,
                event.owner.pid,
                moment,
                moment,
                None,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                None,
                None,
                version,
                None,
                None,
            )
            marks = ", ".join("?" * len(COLUMNS))
            cursor.execute(
                sql(
                    f"INSERT INTO {self.table} ({', '.join(COLUMNS)}) VALUES ({marks}) "
                    "ON CONFLICT (aggregate_id) DO NOTHING"
                ),
                values,
            )
            return
        # Each change: (SET clause, its parameters); the row's version always moves.
        sets: str
        params: tuple[Any, ...]
        if kind == "Attempting":
            sets = (
                "state = ?, owner_host = ?, owner_pid = ?, send_attempts = send_attempts + 1, "
                "arrived_before = may_have_arrived, may_have_arrived = 1"
            )
            params = (ObligationState.ATTEMPTING.value, event.by.host, event.by.pid)
        elif kind == "Claimed":
            sets = (
                "state = ?, owner_host = ?, owner_pid = ?, claims = claims + 1, "
                "recovery_attempts = ?, fence = ?, arrived_before = ?, may_have_arrived = 1"
            )
            params = (
                ObligationState.CLAIMED.value,
                event.by.host,
                event.by.pid,
                event.recovery_attempt,
                event.fence,
                int(bool(event.needs_marker)),
            )
        elif kind == "Failed":
            lowered = ErrorClass(event.classification).may_have_arrived is False
            sets = "state = ?, error_class = ?" + (
                ", may_have_arrived = arrived_before" if lowered else ""
            )
            params = (ObligationState.FAILED.value, event.classification)
        elif kind == "Delivered":
            sets = "state = ?, delivered_at = ?"
            params = (ObligationState.DELIVERED.value, moment)
        elif kind == "Abandoned":
            sets = "state = ?, abandon_reason = ?"
            params = (ObligationState.ABANDONED.value, event.reason)
        elif kind == "RetryRequested":
            sets = (
                "state = ?, owner_host = ?, owner_pid = ?, retries = retries + 1, "
                "recovery_attempts = 0, fence = ?"
            )
            params = (ObligationState.PENDING.value, event.by.host, event.by.pid, event.fence)
        elif kind == "Quarantined":
            sets = (
                "state = ?, owner_host = ?, owner_pid = ?, fence = ?, "
                "quarantine_reason = ?, quarantine_version = ?"
            )
            params = (
                QUARANTINED,
                event.by.host,
                event.by.pid,
                event.fence,
                QuarantineReason(event.reason).value,
                int(event.found_at),
            )
        else:
            sets, params = "state = state", ()  # PartDelivered, or a type added later
        cursor.execute(
            sql(
                f"UPDATE {self.table} SET {sets}, last_transition_at = ?, version = ? "
                f"WHERE aggregate_id = ? AND {STILL_READ}"
            ),
            (*params, moment, version, key),
        )

    def quarantine_row(self, bad: Undecodable) -> dict[str, Any]:
        return {
            "obligation_id": bad.obligation_id or bad.originator_id.hex,
            "platform": "",
            "subject_id": "",
            "owner_host": "",
            "owner_pid": 0,
            "recorded_at": 0,
            "last_transition_at": 0,
            "send_attempts": 0,
            "claims": 0,
            "recovery_attempts": 0,
            "retries": 0,
            "fence": 0,
            "may_have_arrived": 0,
            "arrived_before": 0,
        }

    def prepare(self) -> None:
        """Set the keyring up before the view's transaction: naming a subject from a clear
        session key needs it, and its first set-up writes through another connection,
        which would wait on this transaction's lock on SQLite."""
        keyring = getattr(self.app.mapper, "keyring", None)
        if keyring is not None:
            keyring.table  # noqa: B018 (the property sets the keyring up)

    def _subject(self, event: Any) -> str:
        """The keyed subject id of the session: named by the sealed envelope (the session
        key itself stays sealed), or keyed from the session key of an event in clear."""
        mapper: Any = self.app.mapper
        keyring = getattr(mapper, "keyring", None)
        if keyring is None:
            return ""
        if event.session_key == ERASED:
            return str(mapper.subject_of(event.originator_id) or "")
        return str(keyring.subject_id(event.session_key))

    # -- use --------------------------------------------------------------------------------

    def select(self, where: str = "", params: tuple[Any, ...] = (), suffix: str = "") -> list[Any]:
        """Rows of the index (``where`` written with ``?`` placeholders)."""
        self.runner.ensure_tables()
        text = f"SELECT {', '.join(COLUMNS)} FROM {self.table}"
        if where:
            text += f" WHERE {where}"
        with self.dialect.read_cursor() as c:
            c.execute(self.dialect.sql(text + suffix), params)
            return list(c.fetchall())
