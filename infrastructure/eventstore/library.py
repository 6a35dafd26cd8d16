"""How our applications plug into the eventsourcing library: the one write path.

Every write of an application whose events may hold personal data (the ledger, the
session store) goes through its :class:`SealedEventStore`, whoever calls it: the library's
``Application.save`` reaches it as ``put`` (which also reports the library's
``Recording`` objects), the ledger's transitions and the gateway's group-commit writer call
``append`` (which does not). Both are one method, ``_write``; what a write does is there,
once:

1. seal the events' personal fields (``PrivateMapper.to_stored_event``) with the data keys
   of this write, a ``WriteKeys`` created for it and passed explicitly: new subjects get a
   new key, noted in it, and stored keys used are noted too;
2. hand the stored events and that ``WriteKeys`` to the recorder,
   ``insert_events(stored_events, keys=...)``: the library's own channel for rows that
   must commit with the events (its ``searchablecontent`` example passes its page rows the
   same way), so the key rows are stored, and the used keys checked, in the events'
   transaction (``keyed_recorder.py`` on SQLite, the recorder's hook in ``postgres.py`` on
   PostgreSQL);
3. share the new keys once that committed, seal again if another writer stored a key for
   the same subject first, forget a key found destroyed (``KeyRing.writing``).

The library is extended only where its examples extend it: the ``construct_*`` methods of
an application, our mapper, event store and recorder classes, and the PostgreSQL
recorder's insert hook (a library internal, owned by ``postgres.py`` alone and pinned by
``tests/test_write_path.py``).

Its generic machinery stays off our paths where it costs more than the work it wraps
(ADR 0067): ``Application.save`` tells an aggregate from an event with two
runtime-checkable protocols, and the repository's default projector asserts one for every
event it replays; on Python 3.11 each such ``isinstance`` recomputes the protocol's
members, which costs more than the event's own ``mutate``. :meth:`PrivateEvents.save` does the
library's steps with class checks, through public methods only, and the repository
replays with :func:`apply_in_order`; ``tests/test_library_save.py`` pins both to the
library's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.application import Repository
from eventsourcing.domain import BaseAggregate
from eventsourcing.persistence import (
    EventStore,
    InfrastructureFactory,
    Mapper,
    Notification,
    Recording,
    StoredEvent,
)
from eventsourcing.utils import get_topic

from gateway_ledger.application.observability.causes import of as causes_of
from gateway_ledger.application.observability.causes import stamp
from gateway_ledger.application.privacy.policy import PrivacyPolicy
from gateway_ledger.infrastructure.eventstore.keyed_recorder import KeyedSQLiteApplicationRecorder
from gateway_ledger.infrastructure.eventstore.store import store_path
from gateway_ledger.infrastructure.privacy.key_table import key_table_for
from gateway_ledger.infrastructure.privacy.keyring import KeyRing, WriteKeys
from gateway_ledger.infrastructure.privacy.private_mapper import ENCRYPT_ENV, PrivateMapper

__all__ = ["ENCRYPT_ENV", "DecryptedAggregates", "PrivateEvents", "SealedEventStore"]

RECORDER_TOPIC = InfrastructureFactory.APPLICATION_RECORDER_TOPIC
_OFF = {"0", "n", "no", "false", "off"}
_KEYED_RECORDERS = {
    "eventsourcing.sqlite": get_topic(KeyedSQLiteApplicationRecorder),
    # By name: importing it would import psycopg into every SQLite user.
    "eventsourcing.postgres": (
        "gateway_ledger.infrastructure.eventstore.postgres:KeyedPostgresApplicationRecorder"
    ),
}

log = logging.getLogger("gateway_ledger.events")

DECRYPTED_CACHE_SIZE = 1024
"""Aggregates kept decrypted between a write and the next (least recently written go)."""


class SealedEventStore(EventStore[UUID]):
    """The application's event store: every write of its events goes through ``_write``."""

    def __init__(self, mapper: PrivateMapper, recorder: Any) -> None:
        super().__init__(mapper=mapper, recorder=recorder)
        self.keyring: KeyRing = mapper.keyring
        self.stores_keys = bool(getattr(recorder, "stores_keys", False))
        """False where the recorder's transaction cannot carry key rows (the library's
        database functions on PostgreSQL): new keys are then stored before the events."""

    def put(self, domain_events: Sequence[Any], **kwargs: Any) -> list[Recording[UUID]]:
        """The library's way in (``Application.save``): the write, then what it recorded."""
        stored, ids = self._write(domain_events, kwargs)
        if not ids:
            return []
        return [
            Recording(
                domain_event,
                Notification(
                    id=notification_id,
                    originator_id=s.originator_id,
                    originator_version=s.originator_version,
                    topic=s.topic,
                    state=s.state,
                ),
            )
            for domain_event, s, notification_id in zip(domain_events, stored, ids, strict=True)
        ]

    def append(self, domain_events: Sequence[Any], **kwargs: Any) -> None:
        """The same write, for callers that want no ``Recording`` of it (the ledger's
        transitions, the group-commit writer): the recorder need not report the events'
        notification ids either."""
        self._write(domain_events, {**kwargs, "notification_ids": False})

    def _write(
        self, domain_events: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[list[StoredEvent], Sequence[int] | None]:
        """Seal and store the events in one transaction, with the data keys they need;
        ``kwargs`` go on to the recorder with them. Raises the library's
        ``IntegrityError`` when another writer took one of the events' versions first,
        and ``SessionErased`` when a key they were sealed with was destroyed meanwhile."""
        if not domain_events:
            return [], None
        stamp(domain_events)  # what caused them, unless stamped where they were handed over
        if not self.stores_keys:
            stored = [self.mapper.to_stored_event(e) for e in domain_events]
            written = stored, self.recorder.insert_events(stored, **kwargs)
        else:

            def write(keys: WriteKeys) -> tuple[list[StoredEvent], Sequence[int] | None]:
                to_stored_event: Any = self.mapper.to_stored_event
                sealed = [to_stored_event(e, keys) for e in domain_events]
                return sealed, self.recorder.insert_events(sealed, keys=keys, **kwargs)

            written = self.keyring.writing(write)
        if log.isEnabledFor(logging.DEBUG):
            log_changes(domain_events)
        return written


def log_changes(domain_events: Sequence[Any]) -> None:
    """One DEBUG line per state change written: the event's type, aggregate, version and
    the ids its metadata holds (never a field's value)."""
    for event in domain_events:
        extra: dict[str, Any] = {
            "event": type(event).__name__,
            "aggregate_id": str(event.originator_id),
            "version": event.originator_version,
            **causes_of(event),
        }
        log.debug("%s v%d written", extra["event"], extra["version"], extra=extra)


class DecryptedAggregates:
    """Aggregates kept decrypted in memory from one write of this process to its next, so
    a change needs no reload: ``take`` one (it is then the caller's alone), change it,
    store its events, ``keep`` it. Never kept longer than a data key is (``ttl``), and
    forgotten at once when its key is destroyed or found destroyed in this process
    (``forget_subject``, from ``KeyRing.on_evict``).

    Whether a kept aggregate is still current is not checked on ``take``: its version is
    the lock, so a write on top of a stale copy fails (``IntegrityError``) and the caller
    reloads.
    """

    def __init__(
        self,
        subject_of: Callable[[UUID], str | None],
        *,
        ttl: float,
        size: int = DECRYPTED_CACHE_SIZE,
    ) -> None:
        self.subject_of = subject_of
        self.ttl = ttl
        self.size = size
        self._kept: OrderedDict[UUID, tuple[float, Any]] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def take(self, aggregate_id: UUID) -> Any | None:
        """The kept aggregate, removed from here; None when there is none (or too old)."""
        with self._lock:
            entry = self._kept.pop(aggregate_id, None)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def keep(self, aggregate: Any) -> None:
        """Keep an aggregate whose events are all stored, for its next change."""
        if self.ttl <= 0:
            return
        expires = time.monotonic() + self.ttl
        with self._lock:
            kept = self._kept
            kept[aggregate.id] = (expires, aggregate)
            kept.move_to_end(aggregate.id)
            if len(kept) > self.size:
                kept.popitem(last=False)

    def forget_subject(self, subject_id: str) -> None:
        """Forget every kept aggregate whose personal data is the subject's, or may be
        (its subject is not known without reading the store)."""
        with self._lock:
            for aggregate_id in list(self._kept):
                if self.subject_of(aggregate_id) in (subject_id, None):
                    del self._kept[aggregate_id]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


def apply_in_order(aggregate: Any, domain_events: Any) -> Any:
    """The library's default projector (``project_aggregate``) without its per-event
    assertion of a runtime-checkable protocol: every event class of ours has ``mutate``."""
    for domain_event in domain_events:
        aggregate = domain_event.mutate(aggregate)
    return aggregate


def _collect(objs: Sequence[Any]) -> tuple[list[Any], dict[UUID, Any]]:
    """The events of ``objs`` (aggregates' pending events, events as they are) and the
    aggregates by id, told apart by class (ADR 0067)."""
    events: list[Any] = []
    aggregates: dict[UUID, Any] = {}
    for obj in objs:
        if obj is None:
            continue
        if isinstance(obj, BaseAggregate):
            events += obj.collect_events()
            aggregates[obj.id] = obj
        else:
            events.append(obj)
    return events, aggregates


class AppliedInOrder(Repository[UUID]):
    """The library's repository, replaying with :func:`apply_in_order` unless a caller
    names another projector (a snapshot's, an operator's point in time)."""

    def get(
        self,
        aggregate_id: UUID,
        *,
        version: int | None = None,
        projector_func: Any = apply_in_order,
        fastforward_skipping: bool = False,
        deepcopy_from_cache: bool = True,
    ) -> Any:
        return super().get(
            aggregate_id,
            version=version,
            projector_func=projector_func,
            fastforward_skipping=fastforward_skipping,
            deepcopy_from_cache=deepcopy_from_cache,
        )


class PrivateEvents:
    """Mixin for an eventsourcing Application whose events may hold personal data.

    Set ``privacy_policy``; encryption is on unless the environment says
    ``GATEWAY_LEDGER_ENCRYPT=n`` (the applications' ``encrypt=False`` sets it). Reading
    always opens sealed events, whatever the setting.
    """

    privacy_policy: ClassVar[PrivacyPolicy] = PrivacyPolicy()
    check_key_at_open: bool = True
    """False for a gateway: it must start and send even without its key, and says at
    ``start()`` that every reply goes untracked (the key is still never made for sealed
    data, and nothing is written without it)."""
    env: Any
    recorder: Any
    repository: Any
    snapshots: Any
    snapshotting_intervals: ClassVar[dict[Any, int]]
    snapshotting_projectors: ClassVar[dict[Any, Any]]
    take_snapshot: Callable[..., None]
    mapper: Any
    events: Any
    decrypted: DecryptedAggregates
    """Aggregates kept decrypted between writes (see :class:`DecryptedAggregates`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Open the store, then check its master key before anything reads or writes: a
        malformed or unsafe key, or none beside sealed data, is refused here, not later
        in the middle of a command (and a new key is never made for sealed data)."""
        super().__init__(*args, **kwargs)
        mapper = self.private_mapper
        self.decrypted = DecryptedAggregates(mapper.remembered_subject, ttl=mapper.keyring.ttl)
        mapper.keyring.on_evict(self.decrypted.forget_subject)
        try:
            if self.check_key_at_open:
                mapper.keyring.check_master_key()
        except BaseException:
            PrivateEvents.close(self)
            raise

    def construct_env(self, name: str, env: Any = None) -> Any:
        """The recorder that stores new data keys with their events, on either store."""
        environment = super().construct_env(name, env)  # type: ignore[misc]
        module = environment.get("PERSISTENCE_MODULE")
        if not environment.get(RECORDER_TOPIC) and module in _KEYED_RECORDERS:
            environment[RECORDER_TOPIC] = _KEYED_RECORDERS[module]
        return environment

    def construct_mapper(self) -> Mapper[UUID]:
        env = self.env
        encrypt = str(env.get(ENCRYPT_ENV, "y")).strip().lower() not in _OFF
        if env.get("PERSISTENCE_MODULE") == "eventsourcing.postgres":
            location = "postgresql://"
        else:
            location = str(store_path(env) or "")
        keyring = KeyRing(
            lambda: key_table_for(self.recorder),
            location,
            key_file=env.get("GATEWAY_LEDGER_KEY_FILE") or None,
        )
        return PrivateMapper(
            self.construct_transcoder(),  # type: ignore[attr-defined]
            self.privacy_policy,
            keyring,
            encrypt=encrypt,
            first_event=self.first_stored_event,
        )

    def construct_event_store(self) -> SealedEventStore:
        """The one write path (see the module docstring)."""
        return SealedEventStore(self.private_mapper, self.recorder)

    def construct_repository(self) -> AppliedInOrder:
        """The repository the library builds (its cache settings read from the
        environment), replaying with :func:`apply_in_order`."""
        built = super().construct_repository()  # type: ignore[misc]
        repository = AppliedInOrder.__new__(AppliedInOrder)
        vars(repository).update(vars(built))
        return repository

    def save(self, *objs: Any, **kwargs: Any) -> list[Recording[UUID]]:
        """The library's ``Application.save``: the objects' events to the event store
        (``events.put``, the one write path, with ``kwargs``), aggregates to the cache
        where one is kept, then the snapshots now due. An aggregate is told from an event
        by its class, not by the library's runtime-checkable protocols (ADR 0067)."""
        events, aggregates = _collect(objs)
        recordings: list[Recording[UUID]] = self.events.put(events, **kwargs)
        self._after_write(events, aggregates)
        return recordings

    def store(self, *objs: Any, **kwargs: Any) -> None:
        """``save`` for a caller that wants no ``Recording``: the write asks the recorder
        for no notification ids (``events.append``; on PostgreSQL the usual write in three
        round trips, ADR 0066)."""
        events, aggregates = _collect(objs)
        self.sealed_events.append(events, **kwargs)
        self._after_write(events, aggregates)

    def _after_write(self, events: list[Any], aggregates: dict[UUID, Any]) -> None:
        repository = self.repository
        if repository.cache is not None and not repository.fastforward:
            for aggregate_id, aggregate in aggregates.items():
                repository.cache.put(aggregate_id, aggregate)
        self.take_snapshots_due(events, aggregates)

    def take_snapshots_due(self, events: Sequence[Any], aggregates: dict[UUID, Any]) -> None:
        """A snapshot of each saved aggregate whose event reached its type's interval, as
        the library's save takes them (``take_snapshot``, replaying with the type's
        ``snapshotting_projectors`` entry or :func:`apply_in_order`)."""
        intervals: dict[Any, int] = self.snapshotting_intervals
        if not intervals or self.snapshots is None:
            return
        projectors: dict[Any, Any] = self.snapshotting_projectors
        for event in events:
            aggregate = aggregates.get(event.originator_id)
            interval = intervals.get(type(aggregate)) if aggregate is not None else None
            if interval is not None and event.originator_version % interval == 0:
                self.take_snapshot(
                    event.originator_id,
                    version=event.originator_version,
                    projector_func=projectors.get(type(aggregate), apply_in_order),
                )

    def first_stored_event(self, originator_id: UUID) -> StoredEvent | None:
        """An aggregate's first stored event, as stored (None: no such aggregate)."""
        events = self.recorder.select_events(originator_id, lte=1, limit=1)
        return events[0] if events else None

    @property
    def sealed_events(self) -> SealedEventStore:
        """The application's event store (``events``): every write goes through it."""
        events = self.events
        assert isinstance(events, SealedEventStore)
        return events

    @property
    def private_mapper(self) -> PrivateMapper:
        mapper = self.mapper
        assert isinstance(mapper, PrivateMapper)
        return mapper

    def close(self) -> None:
        """Close the key table's and the recorder's own connections too, then the store's."""
        decrypted = getattr(self, "decrypted", None)
        if decrypted is not None:
            decrypted.clear()
        self.private_mapper.keyring.close()
        close_recorder = getattr(self.recorder, "close", None)
        if close_recorder is not None:
            close_recorder()
        super().close()  # type: ignore[misc]
