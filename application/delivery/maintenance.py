"""``verify``: is the store whole? Integrity, contiguous streams, decodable events, views.

The checks that need SQL come through a :class:`StoreHealth` port (the infrastructure's
``StoreChecks``); decoding goes through the application's own mapper, so an event that
verify passes is one every reader can read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import attrs

from gateway_ledger.projections.view import MaterializedView

MAX_LISTED = 20


class StoreHealth(Protocol):
    def integrity_problems(self) -> list[str]: ...
    def broken_streams(self, limit: int = ...) -> list[tuple[str, int, int, int]]: ...
    def stored_events(self, page_size: int = ...) -> Iterator[list[Any]]: ...


@attrs.frozen
class VerifyReport:
    integrity: tuple[str, ...]
    broken_streams: tuple[tuple[str, int, int, int], ...]
    events_checked: int
    undecodable: tuple[tuple[str, int, str, str], ...]
    undecodable_count: int
    views: tuple[tuple[str, bool, int], ...]
    elapsed_seconds: float

    @property
    def ok(self) -> bool:
        return (
            not self.integrity
            and not self.broken_streams
            and not self.undecodable_count
            and all(equal for _, equal, _ in self.views)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "integrity": list(self.integrity),
            "broken_streams": [
                {"aggregate_id": a, "events": n, "first": f, "last": last}
                for a, n, f, last in self.broken_streams
            ],
            "events_checked": self.events_checked,
            "undecodable_count": self.undecodable_count,
            "undecodable": [
                {"aggregate_id": a, "version": v, "topic": t, "reason": r}
                for a, v, t, r in self.undecodable
            ],
            "views": [{"name": n, "equal": e, "rows": r} for n, e, r in self.views],
            "elapsed_seconds": self.elapsed_seconds,
        }


def verify_store(
    health: StoreHealth,
    mapper: Any,
    topics: Sequence[str],
    views: Sequence[MaterializedView],
) -> VerifyReport:
    """Run every check; decode each stored event whose topic starts with one of
    ``topics`` through ``mapper`` (``decode_each``: a bad event is returned, not raised);
    rebuild each view beside itself and compare (a differing view is repaired and
    reported)."""
    started = time.perf_counter()
    integrity = tuple(health.integrity_problems())
    broken = tuple(health.broken_streams(MAX_LISTED))
    checked, bad_count = 0, 0
    bad: list[tuple[str, int, str, str]] = []
    prefixes = tuple(topics)
    for page in health.stored_events():
        ours = [s for s in page if s.topic.startswith(prefixes)]
        checked += len(ours)
        for stored, event in zip(ours, mapper.decode_each(ours), strict=True):
            reason = getattr(event, "reason", None)
            if reason is None or not hasattr(event, "error"):
                continue
            bad_count += 1
            if len(bad) < MAX_LISTED:
                bad.append(
                    (
                        str(stored.originator_id),
                        stored.originator_version,
                        stored.topic,
                        str(getattr(reason, "value", reason)),
                    )
                )
    compared = []
    for view in views:
        report = view.rebuild_and_verify()
        compared.append((report.name, report.equal, report.rows))
    return VerifyReport(
        integrity=integrity,
        broken_streams=broken,
        events_checked=checked,
        undecodable=tuple(bad),
        undecodable_count=bad_count,
        views=tuple(compared),
        elapsed_seconds=round(time.perf_counter() - started, 3),
    )
