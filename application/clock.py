"""The only place gateway-ledger reads the wall clock; the domain is always handed ``now``.

Every application takes a ``clock`` (tests give a fixed or stepping one); this is the
default. It is part of the application layer because reading the time is what a use case
does before it asks the domain to decide: no store, thread or file is behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)
