"""Pins: a background process works on a key's session, so no reset may end it under it.

A key is pinned by this process (``pin``/``pinned``) or, through ``has_active_processes``,
by whatever registry the gateway keeps of its background work. When that registry cannot
answer, the key counts as pinned: an unknown state keeps the session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("gateway_ledger.sessions")


class SessionPins:
    def __init__(self, has_active_processes: Callable[[str], bool] | None = None) -> None:
        self.has_active_processes = has_active_processes
        self.counts: dict[str, int] = {}

    def pin(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        count = self.counts.get(key, 0) - 1
        if count > 0:
            self.counts[key] = count
        else:
            self.counts.pop(key, None)

    @contextmanager
    def pinned(self, key: str) -> Iterator[None]:
        self.pin(key)
        try:
            yield
        finally:
            self.unpin(key)

    def is_pinned(self, key: str) -> bool:
        if self.counts.get(key):
            return True
        if self.has_active_processes is None:
            return False
        try:
            return bool(self.has_active_processes(key))
        except Exception as e:  # fail closed: an unknown state keeps the session
            log.warning(
                "has_active_processes failed (%s); treating the session as pinned",
                type(e).__name__,
            )
            return True
