"""The delivery views in SQL: the recoverable obligations and the obligation index.

What each view shows and how events change it is in ``projections/delivery/``; here are
their tables (the same DDL on SQLite and PostgreSQL), the quarantine rule as a SQL
condition, and the queries the sweep and operators' commands ask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.application import Application

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import QUARANTINED, OwnerIdentity
from gateway_ledger.infrastructure.eventstore.sql_dialect import Cursor, SqlDialect
from gateway_ledger.infrastructure.privacy.private_mapper import ERASED
from gateway_ledger.infrastructure.views.fold import declared_defaults
from gateway_ledger.infrastructure.views.sql_view import SqlView
from gateway_ledger.projections.delivery.obligation_index import (
    INDEX_NAME,
    UNRESOLVED,
    DeliveryTally,
    GroupCount,
    IndexEntry,
    IndexProjection,
    IndexQuery,
    IndexTally,
    ObligationIndexView,
    UndecodableEntry,
    nearest_rank,
)
from gateway_ledger.projections.delivery.obligation_view import (
    KEY,
    STILL_READ_REASON,
    from_micros,
    still_read,
    to_micros,
)
from gateway_ledger.projections.delivery.recoverable import (
    VIEW_NAME,
    RecoverableEntry,
    RecoverableProjection,
    RecoverableView,
)
from gateway_ledger.projections.rows import Value

DURATION = "(delivered_at - recorded_at)"
"""Record to delivery of an index row, in microseconds (indexed: ``by_delivery_time``)."""

QUARANTINE_COLUMN_TYPES = {"quarantine_reason": "TEXT", "quarantine_version": "BIGINT"}
"""The quarantine columns' SQL types (a view made before ADR 0027 gains them)."""
STATUS_COLUMN_TYPES = {
    "platform_status": "TEXT",
    "failed_after_acceptance": "INTEGER NOT NULL DEFAULT 0",
}
"""The index's platform-status columns (ADR 0050; an index made before gains them)."""

STILL_READ = (
    f"({{row}}quarantine_reason IS NULL OR {{row}}quarantine_reason = '{STILL_READ_REASON}')"
)
"""A row later events still change (the rule: ``projections/delivery/obligation_view.py``)."""


class SqlObligationView(SqlView):
    """What both obligation views share in SQL: the key, the quarantine guard and columns."""

    key = KEY
    guard = STILL_READ

    def takes_changes(self, read: Callable[[str], Value]) -> bool:
        return still_read(read("quarantine_reason"))

    columns: str
    """The table's column definitions (the quarantine columns are added to them)."""
    added_columns: Mapping[str, str] = {}
    """Columns added to tables made before them (name -> type), besides the quarantine's."""
    indexes: Mapping[str, str]
    """Index name suffix -> its columns."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "columns" in cls.__dict__ or "added_columns" in cls.__dict__:
            cls.column_defaults = declared_defaults(
                cls.columns, QUARANTINE_COLUMN_TYPES, cls.added_columns
            )

    def create_tables(self, cursor: Cursor, dialect: SqlDialect) -> None:
        quarantine = ", ".join(f"{n} {kind}" for n, kind in QUARANTINE_COLUMN_TYPES.items())
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({self.columns}, {quarantine})")
        dialect.add_missing_columns(cursor, self.name, QUARANTINE_COLUMN_TYPES)
        if self.added_columns:
            dialect.add_missing_columns(cursor, self.name, dict(self.added_columns))
        for suffix, columns in self.indexes.items():
            dialect.create_index(cursor, f"{self.name}_{suffix}", self.name, columns)

    def select(self, where: str = "", params: tuple[Any, ...] = (), suffix: str = "") -> list[Any]:
        """Rows of the view, as the store returns them (``where`` with ``?`` placeholders)."""
        self.runner.ensure_tables()
        text = f"SELECT * FROM {self.table}"
        if where:
            text += f" WHERE {where}"
        with self.dialect.read_cursor() as c:
            c.execute(self.dialect.sql(text + suffix), params)
            return list(c.fetchall())


# -- the recoverable obligations ---------------------------------------------------------------


class SqlRecoverableView(SqlObligationView, RecoverableView):
    """The unresolved obligations, in the table ``recoverable_obligations``."""

    columns = (
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
        "version BIGINT NOT NULL"
    )
    indexes = {"by_recorded_at": "recorded_at, obligation_id"}

    def __init__(self, app: Application[Any], name: str = VIEW_NAME) -> None:
        super().__init__(app, RecoverableProjection(name))

    def renamed(self, name: str) -> SqlRecoverableView:
        return SqlRecoverableView(self.app, name)

    def entries(self) -> list[RecoverableEntry]:
        rows = self.select(suffix=" ORDER BY recorded_at, obligation_id")
        owners: dict[tuple[Any, ...], OwnerIdentity] = {}
        return [RecoverableEntry.from_row(row, owners) for row in rows]


# -- the obligation index ----------------------------------------------------------------------


class MapperSubjects:
    """Names a recorded reply's session by the keyed subject id the privacy keyring uses:
    from the sealed envelope (the session key itself stays sealed), or keyed from the
    session key of an event written in clear. '' where the store keys no subjects."""

    def __init__(self, mapper: Any) -> None:
        self.mapper = mapper

    def subject_of(self, event: DeliveryObligation.Recorded) -> str:
        keyring = getattr(self.mapper, "keyring", None)
        if keyring is None:
            return ""
        if event.session_key == ERASED:
            return str(self.mapper.subject_of(event.originator_id) or "")
        return str(keyring.subject_id(event.session_key))


class SqlObligationIndex(SqlObligationView, ObligationIndexView):
    """One row per obligation, in the table ``obligation_index``."""

    columns = (
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
        "version BIGINT NOT NULL"
    )
    added_columns = STATUS_COLUMN_TYPES
    indexes = {
        "by_state": "state, recorded_at",
        "by_subject": "subject_id, recorded_at",
        "by_recorded_at": "recorded_at",
        "by_delivery_time": DURATION,
    }

    def __init__(self, app: Application[Any], name: str = INDEX_NAME) -> None:
        super().__init__(app, IndexProjection(MapperSubjects(app.mapper), name))

    def renamed(self, name: str) -> SqlObligationIndex:
        return SqlObligationIndex(self.app, name)

    def prepare(self) -> None:
        """Set the keyring up before the view's transaction: naming a subject from a clear
        session key needs it, and its first set-up writes through another connection,
        which would wait on this transaction's lock on SQLite."""
        keyring = getattr(self.app.mapper, "keyring", None)
        if keyring is not None:
            keyring.table  # noqa: B018 (the property sets the keyring up)

    def entries(self, query: IndexQuery) -> list[IndexEntry]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("state", query.state),
            ("platform", query.platform),
            ("platform_status", query.platform_status),
            ("subject_id", query.subject_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if query.recorded_since is not None:
            where.append("recorded_at >= ?")
            params.append(to_micros(query.recorded_since))
        suffix = " ORDER BY recorded_at, obligation_id"
        if query.limit is not None:
            suffix += f" LIMIT {int(query.limit)}"
        rows = self.select(" AND ".join(where), tuple(params), suffix)
        return [IndexEntry.from_row(r) for r in rows]

    def tally(
        self, *, max_quarantined_ids: int, latency_bounds: Sequence[float] = ()
    ) -> IndexTally:
        self.runner.ensure_tables()
        table = self.table
        with self.dialect.read_cursor() as c:
            c.execute(
                "SELECT platform, state, COUNT(*) AS n, SUM(claims) AS claims, "
                "SUM(CASE WHEN claims > 0 THEN 1 ELSE 0 END) AS claimed, "
                "SUM(failed_after_acceptance) AS failed_after, "
                "SUM(CASE WHEN platform_status = 'read' THEN 1 ELSE 0 END) AS read, "
                "SUM(CASE WHEN platform_status = 'delivered_to_device' THEN 1 ELSE 0 END)"
                " AS on_device, "
                f"SUM(retries) AS retries FROM {table} GROUP BY platform, state"
            )
            groups = tuple(
                GroupCount(
                    platform=row["platform"],
                    state=row["state"],
                    obligations=int(row["n"]),
                    claims=int(row["claims"] or 0),
                    claimed=int(row["claimed"] or 0),
                    retries=int(row["retries"] or 0),
                    failed_after_acceptance=int(row["failed_after"] or 0),
                    read=int(row["read"] or 0),
                    delivered_to_device=int(row["on_device"] or 0),
                )
                for row in c.fetchall()
            )
            c.execute(
                f"SELECT abandon_reason, COUNT(*) AS n FROM {table} "
                "WHERE state = 'abandoned' GROUP BY abandon_reason"
            )
            reasons = {str(row["abandon_reason"]): int(row["n"]) for row in c.fetchall()}
            marks = ", ".join(f"'{s}'" for s in UNRESOLVED)
            c.execute(
                f"SELECT obligation_id, recorded_at FROM {table} WHERE state IN ({marks}) "
                "ORDER BY recorded_at, obligation_id LIMIT 1"
            )
            row = c.fetchone()
            oldest = (
                None
                if row is None
                else (str(row["obligation_id"]), from_micros(row["recorded_at"]))
            )
            delivery = self._delivery(c, latency_bounds)
            quarantined_ids: tuple[str, ...] = ()
            if any(g.state == QUARANTINED for g in groups):  # a healthy store reads no ids
                c.execute(
                    f"SELECT obligation_id FROM {table} WHERE state = '{QUARANTINED}' "
                    f"ORDER BY recorded_at, obligation_id LIMIT {int(max_quarantined_ids)}"
                )
                quarantined_ids = tuple(str(r["obligation_id"]) for r in c.fetchall())
        return IndexTally(
            groups=groups,
            abandoned_by_reason=reasons,
            oldest_unresolved=oldest,
            delivery=delivery,
            quarantined_ids=quarantined_ids,
        )

    def _delivery(self, c: Cursor, bounds: Sequence[float]) -> DeliveryTally:
        """Record to delivery counted in the store: one pass for count, sum, maximum and
        buckets, and an index walk to each percentile's rank (``by_delivery_time``)."""
        table = self.table
        buckets = "".join(
            f", SUM(CASE WHEN {DURATION} <= {round(b * 1e6)} THEN 1 ELSE 0 END) AS b{i}"
            for i, b in enumerate(bounds)
        )
        c.execute(
            f"SELECT COUNT(*) AS n, SUM({DURATION}) AS total, MAX({DURATION}) AS longest"
            f"{buckets} FROM {table} WHERE delivered_at IS NOT NULL"
        )
        row = c.fetchone()
        count = int(row["n"])
        cumulative = (*(int(row[f"b{i}"] or 0) for i in range(len(bounds))), count)
        if count == 0:
            return DeliveryTally(0, 0.0, None, None, None, cumulative)

        def at_rank(fraction: float) -> float:
            c.execute(
                f"SELECT {DURATION} AS d FROM {table} WHERE delivered_at IS NOT NULL "
                f"ORDER BY {DURATION} LIMIT 1 OFFSET {nearest_rank(count, fraction) - 1}"
            )
            return int(c.fetchone()["d"]) / 1e6

        return DeliveryTally(
            count=count,
            total=round(int(row["total"]) / 1e6, 6),
            p50=at_rank(0.50),
            p95=at_rank(0.95),
            max=int(row["longest"]) / 1e6,
            cumulative=cumulative,
        )

    def undecodable(self) -> list[UndecodableEntry]:
        rows = self.select(
            "quarantine_reason IS NOT NULL AND quarantine_reason <> ?",
            (STILL_READ_REASON.value,),
        )
        return [
            UndecodableEntry(
                aggregate_id=UUID(str(r["aggregate_id"])),
                obligation_id=str(r["obligation_id"]),
                version=int(r["quarantine_version"]),
                reason=str(r["quarantine_reason"]),
            )
            for r in rows
        ]


VIEWS: dict[str, Callable[[Application[Any]], SqlObligationView]] = {
    VIEW_NAME: SqlRecoverableView,
    INDEX_NAME: SqlObligationIndex,
}
"""The ledger's views in SQL, by name."""
