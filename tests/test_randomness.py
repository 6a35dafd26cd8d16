"""Nonces and key material come from the OS in bulk: never repeated, not even across a fork."""

from __future__ import annotations

import os

from gateway_ledger.infrastructure.randomness import RandomPool


def test_nonces_are_twelve_bytes_and_never_repeat_across_refills() -> None:
    pool = RandomPool()
    taken = [pool.take(12) for _ in range(3 * RandomPool.SIZE // 12 + 5)]
    assert {len(n) for n in taken} == {12}
    assert len(set(taken)) == len(taken)


def test_mixed_sizes_never_overlap() -> None:
    pool = RandomPool()
    taken = [pool.take(32 if i % 3 else 12) for i in range(1000)]
    assert [len(t) for t in taken] == [32 if i % 3 else 12 for i in range(1000)]
    assert len(set(taken)) == len(taken)


def test_a_forked_child_never_reuses_the_parents_unused_nonces() -> None:
    pool = RandomPool()
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
