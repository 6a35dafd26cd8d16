"""Fresh OS randomness drawn in bulk: one system call per few kilobytes, not one per use.

``os.urandom`` releases the GIL, and on the busy writer thread each release can cost a
wait for the event loop to hand it back (ADR 0015). A pool is exactly as random (every
byte comes from the OS and is handed out once); a forked child drops what its parent
drew (``os.register_at_fork``), so parent and child never share a byte.
"""

from __future__ import annotations

import os
import threading
import weakref

_pools: weakref.WeakSet[RandomPool] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for pool in list(_pools):
        pool.forget()


os.register_at_fork(after_in_child=_forget_after_fork)


class RandomPool:
    """Hands out OS random bytes, each once (AES-GCM nonces, data keys, key ids)."""

    SIZE = 12 * 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0
        _pools.add(self)

    def forget(self) -> None:
        """After a fork: the child must never reuse the parent's unused bytes."""
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0

    def take(self, n: int = 12) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._pool):
                self._pool, at = os.urandom(max(self.SIZE, n)), 0
            self._at = at + n
            return self._pool[at : at + n]


shared_pool = RandomPool()
"""The process's pool for key material and nonces."""
