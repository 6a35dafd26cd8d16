"""Per-subject data keys: created on first use, wrapped by the master key, cached briefly.

A subject is one session key, named in the store only by a keyed hash (``subject_id``),
so neither the key table nor an event envelope holds the session key itself. Unwrapped
keys are cached per process for ``GATEWAY_LEDGER_KEY_CACHE_TTL`` seconds (default 60):
after an erasure elsewhere, this process stops using the destroyed key within that time,
and a write sealed with it meanwhile is refused by its own transaction (``SessionErased``,
ADR 0028), which makes every key ring here forget the key at once.

Every write creates the keys its events need in its own transaction (:meth:`KeyRing.writing`):
the write carries a :class:`WriteKeys`, passed explicitly from the mapping of its events to
the recorder that stores them; a new key is usable by that write at once, its row is
stored with the write's events, and it joins the shared cache only once that commit
succeeded (ADR 0017).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from eventsourcing.persistence import OperationalError

from gateway_ledger.domain.errors import InvalidInput, LedgerError, SessionErased
from gateway_ledger.infrastructure.privacy.key_table import (
    KeyRaceLost,
    KeyTable,
    NewKeyRow,
    is_tombstone,
    made_before_erasure,
    overtaken_by_erasure,
)
from gateway_ledger.infrastructure.privacy.master_key import (
    derive,
    load_master_key,
    read_master_key,
)
from gateway_ledger.infrastructure.randomness import shared_pool

log = logging.getLogger("gateway_ledger.privacy")

CACHE_TTL_ENV = "GATEWAY_LEDGER_KEY_CACHE_TTL"
DEFAULT_CACHE_TTL = 60.0
DEFAULT_CACHE_SIZE = 4096
_MASTER_CHECK = "master_key_check"

_keyrings: weakref.WeakSet[KeyRing] = weakref.WeakSet()


class MasterKeyMismatch(LedgerError):
    """The store's keys were wrapped by another master key: refuse rather than lose data."""


KEY_RACE_RETRIES = 3
"""Times a writer seals again after another writer stored a new subject's key first."""

T = TypeVar("T")


class WriteKeys:
    """The data keys one write seals its events with, handed with the events to the
    recorder: the keys created for it (``keys``; their ``rows`` are stored in the events'
    transaction, and the keys are shared once it committed), the tombstones those rows
    replace (``replacing``: subject -> tombstone id), and the stored keys it used
    (``used``: subject -> key id), which that transaction checks are still there
    (ADR 0028). ``seen`` is what the write found first in each subject's row, kept
    across its attempts (see :func:`overtaken_by_erasure`, ADR 0071)."""

    __slots__ = ("keys", "replacing", "rows", "seen", "used")

    def __init__(self, seen: dict[str, str | None] | None = None) -> None:
        self.keys: dict[str, tuple[str, AESGCM]] = {}
        self.rows: list[NewKeyRow] = []
        self.replacing: dict[str, str] = {}
        self.used: dict[str, str] = {}
        self.seen: dict[str, str | None] = {} if seen is None else seen


def cache_ttl_from_env() -> float:
    """``GATEWAY_LEDGER_KEY_CACHE_TTL`` in seconds; a malformed value is refused by name."""
    raw = os.environ.get(CACHE_TTL_ENV, "").strip()
    if not raw:
        return float(DEFAULT_CACHE_TTL)
    try:
        ttl = float(raw)
    except ValueError:
        raise InvalidInput(f"{CACHE_TTL_ENV}={raw!r} is not a number of seconds") from None
    if not math.isfinite(ttl) or ttl < 0:
        raise InvalidInput(f"{CACHE_TTL_ENV}={raw!r} must be a finite number of seconds >= 0")
    return ttl


class KeyedDigest:
    """HMAC-SHA256 under one key (RFC 2104), from the hash states after the padded key,
    taken once: each digest copies them. The same output as ``hmac.new(key, value,
    "sha256")``; each call costs two hash copies instead of ``hmac.HMAC``'s Python-level
    copy, update and hexdigest, once per reply (the inbound cause). It hashes with the
    GIL held, as ``hashlib`` does for short input: ``hmac.digest`` releases it on every
    call, and a thread waiting on the GIL then holds the event loop up for a whole switch
    interval."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))

    def hexdigest(self, value: str) -> str:
        inner = self._inner.copy()
        inner.update(value.encode("utf-8"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


class KeyRing:
    """Finds, creates and destroys subject data keys in one store's key table."""

    def __init__(
        self,
        table: Callable[[], KeyTable],
        location: str,
        *,
        key_file: str | Path | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_ttl: float | None = None,
    ) -> None:
        self._table_factory = table
        self._table: KeyTable | None = None  # set once the master key is checked against it
        self._opened_table: KeyTable | None = None
        self._master: bytes | None = None
        self.location = location
        self.key_file = key_file
        ttl = cache_ttl if cache_ttl is not None else cache_ttl_from_env()
        self.cache_size = cache_size
        self.ttl = ttl
        # subject_id -> (expires, key_id, AESGCM): read on every sealed event, so a plain
        # dict (one atomic lookup) rather than the locked LRU; cleared when full.
        self._sealing: dict[str, tuple[float, str, AESGCM]] = {}
        # key_id -> (expires, (subject_id, AESGCM) or None when destroyed): same reasoning.
        self._opening: dict[str, tuple[float, tuple[str, AESGCM] | None]] = {}
        self._init_lock = threading.Lock()
        self._wrap: AESGCM | None = None
        self._name_digest: KeyedDigest | None = None  # set with the master key
        self._master_for_derivation: bytes | None = None
        self._names: dict[str, str] = {}  # session key -> subject id (pure function, cached)
        self._on_evict: list[Callable[[str], object]] = []
        _keyrings.add(self)

    # -- set-up -----------------------------------------------------------------------------

    @property
    def table(self) -> KeyTable:
        if self._table is None:
            self._setup()
        assert self._table is not None
        return self._table

    def _key_table(self) -> KeyTable:
        if self._opened_table is None:
            self._opened_table = self._table_factory()
        return self._opened_table

    def _is_sealed(self, table: KeyTable) -> bool:
        """Whether a master key was ever used on this store (its check value is stored)."""
        return table.get_meta(_MASTER_CHECK) is not None

    def check_master_key(self) -> None:
        """At open: a configured key must be well-formed and private, and a missing one is
        refused (``MasterKeyMissing``) when the store holds sealed data. Creates nothing:
        a store that holds nothing sealed yet gets its key on first use."""
        with self._init_lock:
            if self._master is not None or self._table is not None:
                return
            master = read_master_key(self.location, self.key_file)
            if master is None:
                if self._is_sealed(self._key_table()):
                    load_master_key(self.location, self.key_file)  # raises MasterKeyMissing
                return
            self._master = master

    def _setup(self) -> None:
        with self._init_lock:
            if self._table is not None:
                return
            table = self._key_table()
            master = self._master or read_master_key(self.location, self.key_file)
            if master is None:
                master = load_master_key(
                    self.location, self.key_file, create=not self._is_sealed(table)
                )
            check = hmac.new(master, b"gateway-ledger master key check v1", "sha256").hexdigest()
            stored = table.put_meta_once(_MASTER_CHECK, check[:32])
            if not hmac.compare_digest(stored, check[:32]):
                raise MasterKeyMismatch(
                    "this store's data keys were wrapped by another master key; "
                    "set GATEWAY_LEDGER_MASTER_KEY or the key file to the store's key"
                )
            self._wrap = AESGCM(derive(master, "gateway-ledger/wrap-data-keys/v1"))
            self._name_digest = KeyedDigest(derive(master, "gateway-ledger/subject-id/v1"))
            self._master_for_derivation = master
            self._table = table

    def close(self) -> None:
        """Close the key table's private connection, if one was opened."""
        table = self._opened_table
        if table is not None:
            table.close()

    def derived_key(self, purpose: str) -> bytes:
        """A key for another keyed-hash purpose, derived from the master key (never stored)."""
        if self._table is None:
            self._setup()
        assert self._master_for_derivation is not None
        return derive(self._master_for_derivation, purpose)

    # -- subjects ---------------------------------------------------------------------------

    def subject_id(self, session_key: str) -> str:
        """A keyed, stable name for a session key: links its events, reveals nothing."""
        known = self._names.get(session_key)
        if known is not None:
            return known
        name = self.keyed_name(session_key)
        if len(self._names) >= DEFAULT_CACHE_SIZE:
            self._names.clear()
        self._names[session_key] = name
        return name

    def keyed_name(self, value: str) -> str:
        """The keyed digest subject ids are made with, of any value (not remembered): the
        cause of a reply names its inbound message so (ADR 0058)."""
        if self._table is None:
            self._setup()
        named = self._name_digest
        assert named is not None  # set by ``_setup`` with the key table
        return named.hexdigest(value)[:32]

    def sealing_key(
        self, subject_id: str, write: WriteKeys | None = None, made_at: datetime | None = None
    ) -> tuple[str, AESGCM]:
        """The subject's current data key, created on first use.

        Within a ``write`` (see :meth:`writing`) a new key is noted in it, to be stored by
        the write's own transaction, and a stored key is noted as used. Without one (a
        mapping outside any write) a new key is stored at once, on the key table's own
        connection. ``made_at`` is when the event being sealed was made: after an erasure
        of the subject, one made before it is refused (``SessionErased``, ADR 0071).
        """
        hot = self._sealing.get(subject_id)
        if hot is not None and hot[0] > time.monotonic():
            if write is not None:
                write.used[subject_id] = hot[1]
            return hot[1], hot[2]
        if write is not None and subject_id in write.keys:
            return write.keys[subject_id]
        table = self.table
        row = table.find(subject_id)
        seen = write.seen if write is not None else {}
        replaces = self._tombstone_to_replace(seen, subject_id, row, made_at)
        if row is None or replaces is not None:
            key_id, dek, wrapped, created = self._new_key(subject_id)
            if write is not None:  # stored with the write's events
                aead = AESGCM(dek)
                write.keys[subject_id] = (key_id, aead)
                write.rows.append((subject_id, key_id, wrapped, created))
                if replaces is not None:
                    write.replacing[subject_id] = replaces
                return key_id, aead
            if table.insert((subject_id, key_id, wrapped, created), replaces):
                aead = AESGCM(dek)
                row = None
                log.debug("data key created for subject %s", subject_id)
            else:
                row = table.find(subject_id)  # a concurrent creator won: use its key
                assert row is not None
                # ... unless an erasure came first: its tombstone is new, SessionErased
                self._tombstone_to_replace(seen, subject_id, row, made_at)
        if row is not None:
            key_id, wrapped, _ = row
            aead = AESGCM(self._unwrap_key(key_id, subject_id, wrapped))
            if write is not None:
                write.used[subject_id] = key_id
        self._cache(subject_id, key_id, aead)
        return key_id, aead

    def forgotten_after(self, subject_id: str, made_at: datetime) -> bool:
        """Whether the subject's row is the tombstone of an erasure that came after
        ``made_at``: what was made then belongs to the forgotten conversation, and a write
        of it sealed before the erasure is refused (ADR 0071). Reads the key table; an
        erasure whose tombstone a newer key replaced is no longer seen (ADR 0073)."""
        row = self.table.find(subject_id)
        return row is not None and is_tombstone(row[0]) and made_before_erasure(made_at, row[2])

    @staticmethod
    def _tombstone_to_replace(
        seen: dict[str, str | None],
        subject_id: str,
        row: tuple[str, bytes, str] | None,
        made_at: datetime | None,
    ) -> str | None:
        """The tombstone a new key of the subject takes the place of (None: no tombstone
        found, or a data key); ``SessionErased`` if the erasure that left it overtook the
        write (:func:`overtaken_by_erasure`, ADR 0071)."""
        if row is None or not is_tombstone(row[0]):
            seen.setdefault(subject_id, row[0] if row is not None else None)
            return None
        if overtaken_by_erasure(seen, subject_id, row[0], row[2], made_at):
            raise SessionErased((subject_id,))
        return row[0]

    def _new_key(self, subject_id: str) -> tuple[str, bytes, bytes, str]:
        key_id = shared_pool.take(12).hex()
        dek = shared_pool.take(32)  # AES-256: 32 fresh bytes from the OS, used once
        created = datetime.now(UTC).isoformat()
        return key_id, dek, self._wrap_key(key_id, subject_id, dek), created

    def _cache(self, subject_id: str, key_id: str, aead: AESGCM) -> None:
        now = time.monotonic()
        if len(self._sealing) >= self.cache_size:
            self._sealing.clear()
        self._sealing[subject_id] = (now + self.ttl, key_id, aead)
        self._remember_opening(key_id, (subject_id, aead), now)

    def writing(self, write: Callable[[WriteKeys], T]) -> T:
        """Run ``write`` (seal events with the :class:`WriteKeys` it is given, then store
        them and that object's new key rows in one transaction) and share the new keys
        once it returned. If it raised, they are forgotten with the events that used them.

        ``write`` raises :class:`KeyRaceLost` when a key row was ignored because another
        writer stored that subject's key meanwhile; it runs again with fresh ``WriteKeys``,
        and the sealing then finds the stored key (one key per subject). It raises
        ``SessionErased`` when a stored key it sealed with was destroyed meanwhile
        (``WriteKeys.used``): that is passed on, and the destroyed key is forgotten by
        every key ring of the process.
        """
        seen: dict[str, str | None] = {}  # what each subject's row held when first found
        for _ in range(KEY_RACE_RETRIES):
            keys = WriteKeys(seen)
            try:
                result = write(keys)
            except KeyRaceLost:
                for subject_id, key_id in keys.used.items():  # sealed from the cache
                    seen.setdefault(subject_id, key_id)
                continue
            except SessionErased as erased:
                for subject_id in erased.subject_ids:
                    evict_everywhere(subject_id, [keys.used.get(subject_id, "")])
                log.info("write refused: %d subject(s) erased meanwhile", len(erased.subject_ids))
                raise
            self.adopt(keys)
            return result
        raise OperationalError("another writer kept creating the same subjects' data keys")

    def adopt(self, keys: WriteKeys) -> None:
        """The write's new key rows are committed: share their keys with every thread."""
        for subject_id, (key_id, aead) in keys.keys.items():
            self._cache(subject_id, key_id, aead)
        if keys.rows:
            log.debug("data keys created for %d subject(s)", len(keys.rows))

    def opening_key(self, subject_id: str, key_id: str) -> tuple[str, AESGCM] | None:
        """The subject's key with this id, or None when it was destroyed (erased)."""
        now = time.monotonic()
        hit = self._opening.get(key_id)
        if hit is not None and hit[0] > now:
            return hit[1]
        wrapped = self.table.get(subject_id, key_id)
        result = None
        if wrapped is not None:
            result = (subject_id, AESGCM(self._unwrap_key(key_id, subject_id, wrapped)))
        self._remember_opening(key_id, result, now)
        return result

    def prefetch_opening(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Read the keys of these ``(subject, key_id)`` pairs that are not cached, in one
        query: a batch of events from many sessions then costs one read, not one each."""
        now = time.monotonic()
        wanted: dict[str, str] = {}  # key_id -> subject
        for subject_id, key_id in pairs:
            hit = self._opening.get(key_id)
            if hit is None or hit[0] <= now:
                wanted[key_id] = subject_id
        if len(wanted) < 2:
            return  # opening_key reads a single one as cheaply
        stored = self.table.get_many(sorted(set(wanted.values())))
        for key_id, subject_id in wanted.items():
            row = stored.get(subject_id)
            result = None
            if row is not None and row[0] == key_id:
                result = (subject_id, AESGCM(self._unwrap_key(key_id, subject_id, row[1])))
            self._remember_opening(key_id, result, now)

    def _remember_opening(self, key_id: str, value: tuple[str, AESGCM] | None, now: float) -> None:
        if len(self._opening) >= self.cache_size:
            self._opening.clear()
        self._opening[key_id] = (now + self.ttl, value)

    def destroy(self, subject_id: str, erased_at: datetime | None = None) -> list[str]:
        """Delete every key of the subject from the store and from every cache here, and
        leave a tombstone of the erasure at ``erased_at`` (the erasure's clock; now if not
        given) in its place."""
        destroyed = self.table.destroy(subject_id, erased_at)
        evict_everywhere(subject_id, destroyed)
        log.info("destroyed %d data key(s) of subject %s", len(destroyed), subject_id)
        return destroyed

    def evict(self, subject_id: str, key_ids: list[str]) -> None:
        """Forget the subject's keys here, and tell whoever keeps data they opened."""
        self._sealing.pop(subject_id, None)
        gone = set(key_ids)
        for key_id, (_, value) in list(self._opening.items()):
            if key_id in gone or (value is not None and value[0] == subject_id):
                self._opening.pop(key_id, None)
        for forget in list(self._on_evict):
            forget(subject_id)

    def on_evict(self, forget: Callable[[str], object]) -> None:
        """Call ``forget(subject_id)`` whenever a subject's keys are forgotten here (its key
        destroyed by an erasure in this process, or found destroyed by a write): for
        caches of data opened with them, which must go with the key."""
        self._on_evict.append(forget)

    # -- wrapping ---------------------------------------------------------------------------

    def _wrap_key(self, key_id: str, subject_id: str, dek: bytes) -> bytes:
        assert self._wrap is not None
        nonce = shared_pool.take(12)
        return nonce + self._wrap.encrypt(nonce, dek, _wrap_aad(key_id, subject_id))

    def _unwrap_key(self, key_id: str, subject_id: str, wrapped: bytes) -> bytes:
        assert self._wrap is not None
        try:
            return self._wrap.decrypt(wrapped[:12], wrapped[12:], _wrap_aad(key_id, subject_id))
        except InvalidTag:
            raise MasterKeyMismatch(
                f"data key {key_id} does not open with this master key"
            ) from None


def evict_everywhere(subject_id: str, key_ids: list[str]) -> None:
    """Forget the subject's keys in every key ring of this process."""
    for ring in list(_keyrings):
        ring.evict(subject_id, key_ids)


def _wrap_aad(key_id: str, subject_id: str) -> bytes:
    return f"gateway-ledger/data-key/v1|{key_id}|{subject_id}".encode()
