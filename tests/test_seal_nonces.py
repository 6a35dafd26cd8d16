"""AES-GCM nonces come from the OS in bulk: never repeated, not even across a fork."""

from __future__ import annotations

import os

from gateway_ledger.infrastructure.private_mapper import _Nonces


def test_nonces_are_twelve_bytes_and_never_repeat_across_refills() -> None:
    pool = _Nonces()
    taken = [pool.take() for _ in range(3 * _Nonces.BATCH + 5)]
    assert {len(n) for n in taken} == {12}
    assert len(set(taken)) == len(taken)


def test_a_forked_child_never_reuses_the_parents_unused_nonces() -> None:
    pool = _Nonces()
    pool.take()  # the pool now holds unused nonces the child would otherwise share
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, b"".join(pool.take() for _ in range(8)))
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 12 * 8)
    os.close(read)
    os.close(write)
    parent = b"".join(pool.take() for _ in range(8))
    child_nonces = {child[i : i + 12] for i in range(0, len(child), 12)}
    parent_nonces = {parent[i : i + 12] for i in range(0, len(parent), 12)}
    assert len(child_nonces) == 8
    assert not child_nonces & parent_nonces
