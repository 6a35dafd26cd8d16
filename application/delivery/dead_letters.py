"""Dead letters: replies abandoned or quarantined, grouped so an operator can act.

Grouped by reason, platform and age (``AGE_BUCKETS``); ``retry`` is the operator's
retry on the record; after their retention ``prune`` keeps their audit facts (the
tombstone: ids, error class, attempts, times) and drops their content.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from gateway_ledger.application.delivery.ledger_ports import LedgerPort
from gateway_ledger.application.delivery.views import ObligationStatus

log = logging.getLogger("gateway_ledger.dead_letters")

AGE_BUCKETS: tuple[tuple[str, timedelta], ...] = (
    ("<1h", timedelta(hours=1)),
    ("<1d", timedelta(days=1)),
    ("<7d", timedelta(days=7)),
    ("<30d", timedelta(days=30)),
)
OLDER = ">=30d"


class DeadLetterRows(Protocol):
    def rows(
        self, *, reason: str | None = None, resolved_before: datetime | None = None
    ) -> list[dict[str, Any]]: ...
    def count_and_oldest(self) -> tuple[int, datetime | None]: ...


def age_bucket(age: timedelta) -> str:
    for label, limit in AGE_BUCKETS:
        if age < limit:
            return label
    return OLDER


@attrs.frozen
class DeadLetterGroup:
    state: str
    reason: str
    platform: str
    age: str
    count: int
    oldest: datetime
    newest: datetime

    def to_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["oldest"] = self.oldest.isoformat()
        data["newest"] = self.newest.isoformat()
        return data


def dead_letter_groups(rows: Sequence[dict[str, Any]], now: datetime) -> list[DeadLetterGroup]:
    """Rows (from ``DeadLetterRows.rows``) grouped by state, reason, platform and age."""
    groups: dict[tuple[str, str, str, str], list[datetime]] = {}
    for row in rows:
        when: datetime = row["last_transition_at"]
        key = (str(row["state"]), str(row["reason"]), str(row["platform"]), age_bucket(now - when))
        groups.setdefault(key, []).append(when)
    return [
        DeadLetterGroup(
            state=k[0],
            reason=k[1],
            platform=k[2],
            age=k[3],
            count=len(times),
            oldest=min(times),
            newest=max(times),
        )
        for k, times in sorted(
            groups.items(), key=lambda item: (item[0][1], item[0][2], min(item[1]))
        )
    ]


def dead_letter_status(dead: DeadLetterRows, now: datetime) -> dict[str, Any]:
    """The figures ``status`` and ``metrics`` show: the count and the oldest one's age."""
    count, oldest = dead.count_and_oldest()
    return {
        "count": count,
        "oldest_age_seconds": None if oldest is None else max(0.0, (now - oldest).total_seconds()),
    }


def retry_dead_letter(ledger: LedgerPort, obligation_id: str, by_operator: str) -> ObligationStatus:
    """Append ``DeadLetterRetried``: the abandoned reply is owed again and the next sweep
    of any gateway sends it (refused on anything but a readable abandoned one)."""
    obligation = ledger.change(
        obligation_id,
        "dead letter retried",
        lambda o: o.retry_dead_letter(
            by=ledger.owner, now=ledger.clock(), requested_by=by_operator
        ),
    )
    log.info("dead letter %s retried on the record (fence %d)", obligation_id, obligation.fence)
    return ObligationStatus.of(obligation)
