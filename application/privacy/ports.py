"""What the privacy use cases need from the sealing machinery and from the applications.

The sealing mapper, its keyring and key table live in ``infrastructure/privacy``; the
use cases (erasure, the ledger's and the session store's reads of a subject) see them
through these protocols only. ``bootstrap.py`` hands the real ones in. Each protocol
names only what the application calls, so the infrastructure may change the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from gateway_ledger.application.privacy.policy import PrivacyPolicy
from gateway_ledger.domain.values import OwnerIdentity


class KeptAggregates(Protocol):
    """Aggregates kept decrypted between one write of this process and its next (the
    obligations of the synchronous API, the sessions a ``resolve`` read for the ``append``
    after it), forgotten with their data key. A kept copy may be behind the store: its
    version is the lock, so a write on top of it fails and the caller reloads."""

    def take(self, aggregate_id: UUID) -> Any | None: ...
    def keep(self, aggregate: Any) -> None: ...


class StoredFirstEvent(Protocol):
    """The stored (sealed) bytes of an aggregate's first event."""

    @property
    def state(self) -> bytes: ...


class KeyStore(Protocol):
    """The table of wrapped data keys, in the events' store."""

    def probe_write(self) -> None:
        """Raise unless a write would be taken (rolled back): read-only store, wrong role."""

    def originators_mentioning(self, topics: Sequence[str], needle: bytes) -> list[str]:
        """Aggregate ids whose events of ``topics`` hold ``needle`` in their clear bytes."""

    def finish_cleanup(self) -> bool:
        """Finish a pending erasure cleanup; True when nothing is pending any more."""


class Keys(Protocol):
    """One store's data keys, one per subject (a session key's keyed hash)."""

    @property
    def table(self) -> KeyStore: ...

    def subject_id(self, session_key: str) -> str:
        """The subject of a session key: a keyed hash, stored in clear."""

    def keyed_name(self, value: str) -> str:
        """The same keyed hash of any value, not remembered (a reply's inbound cause)."""

    def destroy(self, subject_id: str, erased_at: datetime | None = None) -> list[str]:
        """Destroy every data key of the subject, leaving a tombstone of the erasure at
        ``erased_at``; the ids of the keys destroyed."""

    def opening_key(self, subject_id: str, key_id: str) -> object | None:
        """The key that opens what was sealed under ``key_id``; None once destroyed."""

    def forgotten_after(self, subject_id: str, made_at: datetime) -> bool:
        """Whether the subject was erased after ``made_at`` (its tombstone says so)."""


class SealingMapper(Protocol):
    """The mapper that seals personal fields on the way to the store."""

    @property
    def keyring(self) -> Keys: ...

    @property
    def policy(self) -> PrivacyPolicy: ...

    @property
    def encrypt(self) -> bool:
        """Whether personal fields are sealed (False: stored in clear)."""

    @property
    def first_event(self) -> Callable[[UUID], StoredFirstEvent | None] | None: ...

    def subject_of(self, originator_id: UUID) -> str | None:
        """The subject an aggregate's personal fields are sealed for (None: clear)."""

    def sealed(self) -> AbstractContextManager[Any]:
        """Within: nothing is opened; personal fields keep their placeholders."""

    def sharing_parses(self) -> AbstractContextManager[Any]:
        """Within: the events a sealed read read, and its parse of them, serve the next
        reader that opens them (ADR 0080)."""


class ErasableLedger(Protocol):
    """The delivery ledger as an erasure sees it."""

    @property
    def owner(self) -> OwnerIdentity: ...

    @property
    def clock(self) -> Callable[[], datetime]: ...

    @property
    def private_mapper(self) -> SealingMapper: ...

    @property
    def repository(self) -> Any: ...

    @property
    def recorder(self) -> Any: ...

    def save(self, *objs: Any, **kwargs: Any) -> Any: ...


class ErasableSessions(Protocol):
    """The session store as an erasure sees it."""

    @property
    def private_mapper(self) -> SealingMapper: ...

    def end_for_erasure(self, session_key: str) -> list[str]:
        """Suspend the key's open conversation; the ids of the sessions it had."""
