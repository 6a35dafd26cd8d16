"""Every projection of the ledger by name, and a rebuild that proves the view is right.

``rebuild_and_verify`` replays the log from scratch into a *shadow* copy of the view
(its own tables, ``<name>_rebuild``), up to exactly the position the live view reflects,
then compares the two row by row. The live view keeps serving sweeps meanwhile. Equal:
the shadow is dropped and the live view is proven. Different: the live view is rebuilt
from the events (they are the truth) and the differences are reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import attrs
from eventsourcing.application import Application

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.projections.delivery.obligation_index import INDEX_NAME, ObligationIndex
from gateway_ledger.projections.delivery.recoverable import VIEW_NAME, RecoverableObligations
from gateway_ledger.projections.runner import DEFAULT_BATCH_SIZE

log = logging.getLogger("gateway_ledger.projections")

SHADOW_SUFFIX = "_rebuild"
Progress = Callable[[int, int], None]


FACTORIES: dict[str, Callable[[Application[Any], str], Any]] = {
    VIEW_NAME: RecoverableObligations,
    INDEX_NAME: ObligationIndex,
}
PROJECTION_NAMES: tuple[str, ...] = tuple(FACTORIES)


def projection(app: Application[Any], name: str, table_name: str | None = None) -> Any:
    """The named projection of ``app`` (optionally backed by other tables: a shadow)."""
    try:
        factory = FACTORIES[name]
    except KeyError:
        known = ", ".join(PROJECTION_NAMES)
        raise InvalidInput(f"no projection named {name!r} (known: {known})") from None
    return factory(app, table_name or name)


@attrs.frozen
class ProjectionStatus:
    name: str
    position: int
    lag: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def projection_status(app: Application[Any], name: str) -> ProjectionStatus:
    view = projection(app, name)
    position = view.runner.position()
    newest = app.recorder.max_notification_id() or 0
    return ProjectionStatus(name, position, max(0, newest - position), view.count())


@attrs.frozen
class RebuildReport:
    """A from-scratch rebuild compared with the incremental view at the same position."""

    name: str
    position: int
    events_replayed: int
    rows: int
    equal: bool
    differences: tuple[str, ...]
    repaired: bool
    elapsed_seconds: float

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["differences"] = list(self.differences)
        return data


def _rows(view: Any) -> dict[str, dict[str, Any]]:
    with view.dialect.read_cursor() as c:
        c.execute(f"SELECT * FROM {view.table}")
        return {str(row["aggregate_id"]): dict(row) for row in c.fetchall()}


def _drop(view: Any) -> None:
    with view.dialect.write_transaction() as c:
        c.execute(f"DROP TABLE IF EXISTS {view.table}")
        c.execute(f"DROP TABLE IF EXISTS {view.runner.tracking_table}")


def _replay(
    app: Application[Any],
    shadow: Any,
    start: int,
    stop: int,
    batch_size: int,
    progress: Progress | None,
) -> int:
    applied = 0
    position = start
    while position < stop:
        page = app.recorder.select_notifications(
            position, batch_size, stop=stop, inclusive_of_start=False
        )
        if not page:
            break
        done, _ = shadow.runner._apply_batch(page)
        applied += done
        position = page[-1].id
        if progress is not None:
            progress(position, stop)
    return applied


def _compare(live: dict[str, Any], rebuilt: dict[str, Any]) -> list[str]:
    found = []
    for key in sorted(live.keys() | rebuilt.keys()):
        a, b = live.get(key), rebuilt.get(key)
        if a == b:
            continue
        if a is None or b is None:
            found.append(f"{key}: {'missing from' if a is None else 'only in'} the live view")
        else:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            found.append(f"{key}: differs in {', '.join(fields)}")
    return found


def rebuild_and_verify(
    app: Application[Any],
    name: str,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> RebuildReport:
    """Rebuild ``name`` from scratch into a shadow and prove it equals the live view."""
    started = time.perf_counter()
    live = projection(app, name)
    live.runner.catch_up(batch_size=batch_size)
    shadow = projection(app, name, name + SHADOW_SUFFIX)
    _drop(shadow)
    shadow.runner.ensure_tables()
    replayed, position = 0, 0
    try:
        for _ in range(10):
            # Read the live rows with their position; bring the shadow to that position.
            target = live.runner.position()
            live_rows = _rows(live)
            if live.runner.position() != target:
                continue  # someone caught the live view up meanwhile: read again
            replayed += _replay(app, shadow, position, target, batch_size, progress)
            position = target
            break
        rebuilt = _rows(shadow)
    finally:
        _drop(shadow)
    differences = _compare(live_rows, rebuilt)
    repaired = False
    if differences:
        log.warning(
            "projection %s differs from its rebuild in %d rows; rebuilding it",
            name,
            len(differences),
        )
        live.runner.rebuild(batch_size=batch_size)
        repaired = True
    report = RebuildReport(
        name=name,
        position=position,
        events_replayed=replayed,
        rows=len(rebuilt),
        equal=not differences,
        differences=tuple(differences[:50]),
        repaired=repaired,
        elapsed_seconds=round(time.perf_counter() - started, 3),
    )
    log.info(
        "projection %s rebuilt from %d events to position %d: %d rows, equal=%s",
        name,
        replayed,
        position,
        report.rows,
        report.equal,
    )
    return report
