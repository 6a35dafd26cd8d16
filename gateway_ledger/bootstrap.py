"""The composition root (ADR 0036): where the applications meet their infrastructure.

The applications (``application/``) declare what they need as ports and know no store,
lease, key or thread. Here each is put together with the infrastructure that satisfies
them, as cosmicpython's ``bootstrap.py`` does:

- :class:`DeliveryLedger`: the ledger application, its events sealed by the private
  mapper and encoded by the orjson transcoder, its owner identity (host, boot, pid,
  installation id), its lease table and heartbeat, and the bulk loader its sweep uses;
- :class:`Gateway`: the delivery path over such a ledger, writing through the
  group-commit writer;
- :func:`open_ledger`, :func:`open_gateway`: a store location (a file path or a
  ``postgresql://`` URL) turned into a started ledger or gateway;
- the erasure commands that open the stores at a location.

Constructors start nothing: no thread, no file written, no lease taken. ``open_*`` (or
``start()``) is the step that starts what runs while a store is open, and ``close()``
stops it. Tests may wire fakes through the same functions (``tests/test_bootstrap.py``).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import PersistenceError, StoredEvent, Transcoder
from eventsourcing.utils import Environment

from gateway_ledger.application.clock import Clock, system_clock
from gateway_ledger.application.delivery import gateway as delivery_gateway
from gateway_ledger.application.delivery import ledger as delivery_ledger
from gateway_ledger.application.delivery.dead_letters import dead_letter_status
from gateway_ledger.application.delivery.gateway import (
    DEFAULT_COMMAND_PREFIXES,
    DEFAULT_LEDGER_DEADLINE,
)
from gateway_ledger.application.delivery.ledger_ports import (
    EventWriter,
    GoneProof,
    LivenessPolicy,
    Loaded,
)
from gateway_ledger.application.delivery.maintenance import VerifyReport, verify_store
from gateway_ledger.application.delivery.operations import Timeline, timeline_of
from gateway_ledger.application.delivery.recovery_port import RecoverySweep, ResumableSessions
from gateway_ledger.application.delivery.retention import (
    DEFAULT_BATCH,
    PruneReport,
    prune_resolved,
)
from gateway_ledger.application.delivery.scheduling import Scheduler
from gateway_ledger.application.privacy.erasure import (
    SESSION_PRIVACY,
    ErasureReport,
    forget_in_ledger,
)
from gateway_ledger.application.privacy.ports import KeptAggregates
from gateway_ledger.application.sessions.keying import is_raw_keys_mode
from gateway_ledger.application.sessions.retention import SessionPruneReport, prune_sessions
from gateway_ledger.application.sessions.store import (
    SESSIONS_APPLICATION_NAME,
    SessionsApplication,
)
from gateway_ledger.domain.delivery.retention import Tombstone
from gateway_ledger.domain.errors import InvalidInput, NotFound
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.retention import SessionTombstone
from gateway_ledger.domain.sessions.route import SessionKeying
from gateway_ledger.domain.sessions.session import session_uuid
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity, require_text
from gateway_ledger.infrastructure.eventstore.archive import (
    archived_streams,
    write_archive,
    write_session_archive,
)
from gateway_ledger.infrastructure.eventstore.bulk_events import load_each
from gateway_ledger.infrastructure.eventstore.group_commit import GroupCommitWriter
from gateway_ledger.infrastructure.eventstore.library import ENCRYPT_ENV, PrivateEvents
from gateway_ledger.infrastructure.eventstore.maintenance import (
    StoreChecks,
    backup_sqlite,
    copy_companions,
    restore_sqlite,
)
from gateway_ledger.infrastructure.eventstore.release import (
    checked_environment,
    record_release,
    running_release,
)
from gateway_ledger.infrastructure.eventstore.retention import SqlDeadLetters, SqlRetention
from gateway_ledger.infrastructure.eventstore.session_retention import SqlSessionRetention
from gateway_ledger.infrastructure.eventstore.sql_dialect import dialect_for
from gateway_ledger.infrastructure.eventstore.store import (
    is_concurrent_ddl,
    is_postgres_url,
    is_read_only,
    opening,
    require_sqlite_store,
    store_environment,
    store_path,
)
from gateway_ledger.infrastructure.eventstore.transcoder import AttrsTranscoding, OrjsonTranscoder
from gateway_ledger.infrastructure.ownership.installation import resolve_installation_id
from gateway_ledger.infrastructure.ownership.leases import (
    Heartbeat,
    LeaseSettings,
    LeaseTable,
    with_idle_transaction_limit,
)
from gateway_ledger.infrastructure.ownership.liveness import (
    LeaseLiveness,
    LocalLiveness,
    proven_gone,
)
from gateway_ledger.infrastructure.ownership.process_identity import current_owner
from gateway_ledger.infrastructure.pacing.shared_budget import SharedBudget
from gateway_ledger.infrastructure.sessions.secrets import load_or_create_secret, secret_path
from gateway_ledger.infrastructure.sessions.transcoding import build_session_transcoder
from gateway_ledger.infrastructure.sessions.transcript_files import JsonlTranscriptFiles
from gateway_ledger.infrastructure.sessions.whatsapp_aliases import BridgeAliasFiles
from gateway_ledger.infrastructure.views.delivery import SqlObligationIndex, SqlRecoverableView
from gateway_ledger.infrastructure.views.sql_view import catch_up_views
from gateway_ledger.projections.delivery.obligation_index import ObligationIndexView
from gateway_ledger.projections.delivery.recoverable import RecoverableView

__all__ = [
    "DeliveryLedger",
    "Gateway",
    "SessionKeyingPeek",
    "SessionStore",
    "build_transcoder",
    "finish_erasure_cleanup",
    "forget_session",
    "open_gateway",
    "open_ledger",
    "open_session_store",
    "open_sessions",
    "open_sessions_for_erasure",
    "owner_of",
]

_DDL_ATTEMPTS = 5
KEY_SUFFIXES = (".key", ".session-secret")
"""The key material beside an SQLite store: its master key, its session secret."""


def build_transcoder() -> Transcoder:
    """The ledger's transcoder: orjson, with every value object its events carry."""
    transcoder = OrjsonTranscoder()
    for cls in delivery_ledger.VALUE_OBJECTS:
        transcoder.register(AttrsTranscoding(cls))
    return transcoder


def owner_of(env: Mapping[str, str], *, persist: bool) -> OwnerIdentity:
    """This process as the owner of what it appends to the store ``env`` names.

    ``persist``: write the installation id beside the store when there is none yet (the
    open step does; a constructor never writes a file). A store opened read-only is
    never written to.
    """
    installation = resolve_installation_id(
        store_path(env), persist=persist and not is_read_only(env)
    )
    return current_owner(installation)


class DeliveryLedger(PrivateEvents, delivery_ledger.DeliveryLedger):
    """The delivery ledger on its store: the public ``DeliveryLedger``.

    Personal fields are encrypted at rest by default (ADR 0012); ``encrypt=False`` stores
    new events in clear (upstream compatibility, benchmarks). Reading always decrypts.
    On PostgreSQL every ledger owner holds a lease by default (ADR 0010): it is acquired
    and renewed from :meth:`start` (``open`` starts it) and released by :meth:`close`.
    ``check_key=False`` defers the master-key check to the first use of a data key (a
    gateway checks at ``start()`` and runs untracked, saying so, if it fails).
    """

    # Restated: the mixin's defaults come first in the MRO, and a subclass is renamed.
    name = delivery_ledger.LEDGER_APPLICATION_NAME
    privacy_policy = delivery_ledger.DeliveryLedger.privacy_policy

    heartbeat: Heartbeat | None = None

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        owner: OwnerIdentity | None = None,
        policy: LedgerPolicy | None = None,
        clock: Clock = system_clock,
        encrypt: bool | None = None,
        lease: LeaseSettings | None = None,
        check_key: bool = True,
    ) -> None:
        environment = dict(env or {})
        self.check_key_at_open = check_key
        self.lease_settings = lease or LeaseSettings.from_env()
        module = environment.get("PERSISTENCE_MODULE") or os.environ.get("PERSISTENCE_MODULE")
        if module == "eventsourcing.postgres":
            environment = with_idle_transaction_limit(environment, self.lease_settings)
        if encrypt is not None:
            environment[ENCRYPT_ENV] = "y" if encrypt else "n"
        if owner is None:
            owner = owner_of(self.construct_env(self.name, environment), persist=False)
        for attempt in range(_DDL_ATTEMPTS):
            try:
                super().__init__(environment, owner=owner, policy=policy, clock=clock)
                break
            except PersistenceError as e:  # several hosts creating one schema's tables at once
                if attempt == _DDL_ATTEMPTS - 1 or not is_concurrent_ddl(e):
                    raise
                time.sleep(0.05 * (attempt + 1))
        sqlite_path = store_path(self.env)
        self.read_only = is_read_only(self.env)
        self.location = str(sqlite_path or self.env.get("POSTGRES_DBNAME") or "")
        is_postgres = self.env.get("PERSISTENCE_MODULE") == "eventsourcing.postgres"
        wanted = self.lease_settings.wanted(is_postgres) and not self.read_only
        self.leases: LeaseTable | None = (
            LeaseTable.of(self) if wanted and (is_postgres or sqlite_path) else None
        )

    @classmethod
    def open(
        cls,
        location: str | Path,
        *,
        owner: OwnerIdentity | None = None,
        policy: LedgerPolicy | None = None,
        clock: Clock = system_clock,
        encrypt: bool | None = None,
        lease: LeaseSettings | None = None,
        existing: bool = False,
        writing: bool = False,
        check_key: bool = True,
    ) -> DeliveryLedger:
        """Open (creating if needed) the store at a file path or a postgresql:// URL, and
        start the ledger (see :func:`open_ledger`)."""
        return open_ledger(
            location,
            owner=owner,
            policy=policy,
            clock=clock,
            encrypt=encrypt,
            lease=lease,
            existing=existing,
            writing=writing,
            check_key=check_key,
            ledger_class=cls,
        )

    def start(self) -> DeliveryLedger:
        """Acquire this owner's lease and keep it renewed, where leases are used (raises
        if the store refuses it). Nothing to do without leases, or when started already."""
        if self.leases is not None and self.heartbeat is None:
            heartbeat = Heartbeat(self.leases, self.owner, self.lease_settings).start()
            self.heartbeat = heartbeat
            weakref.finalize(self, heartbeat.signal_stop)  # a ledger never closed
        return self

    def close(self) -> None:
        """Release this owner's lease (others may take its work at once), then close."""
        heartbeat, self.heartbeat = self.heartbeat, None
        if heartbeat is not None:
            heartbeat.stop(release=True)
        super().close()

    def construct_transcoder(self) -> Transcoder:
        return build_transcoder()

    @property
    def liveness(self) -> LivenessPolicy:
        """Leases where this ledger uses them (PostgreSQL by default), else /proc (ADR 0010)."""
        if self.leases is not None:
            return LeaseLiveness(self.leases, self.lease_settings.clock_skew)
        return LocalLiveness()

    @property
    def gone_proof(self) -> GoneProof:
        return proven_gone

    def load_each(
        self, aggregate_ids: Sequence[UUID], viewed: Mapping[UUID, int] | None = None
    ) -> Loaded:
        return load_each(self, aggregate_ids, viewed)

    @property
    def kept(self) -> KeptAggregates:
        return self.decrypted

    def construct_recoverable_view(self) -> RecoverableView:
        return SqlRecoverableView(self)

    def construct_obligation_index(self) -> ObligationIndexView:
        return SqlObligationIndex(self)

    # -- retention (ADR 0053) -------------------------------------------------------------

    @property
    def retention(self) -> SqlRetention:
        return SqlRetention(self, [self.recoverable, self.obligation_index])

    def retention_status(self) -> dict[str, Any]:
        """The dead letters (count, oldest age) and the tombstones: for ``status`` and
        ``LedgerCollector``."""
        return retention_status(self)

    def was_pruned(self, obligation_id: str) -> bool:
        return self.tombstone(obligation_id) is not None

    def tombstone(self, obligation_id: str) -> Tombstone | None:
        """What stays of a pruned obligation (None: not pruned)."""
        return self.retention.tombstone(self.aggregate_id(obligation_id))

    def prune(
        self,
        older_than: timedelta,
        *,
        archive: str | Path | None = None,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH,
        limit: int | None = None,
        reason: str | None = None,
        forget_tombstones_older_than: timedelta | None = None,
    ) -> PruneReport:
        """Move resolved obligations whose last transition is older than ``older_than``
        out of the store: their events to ``archive`` (default: ``<store>.archive.jsonl.gz``
        beside an SQLite store; required on PostgreSQL; ``""``: none), a tombstone in their
        place. ``reason``: only dead letters abandoned for it. Tombstones older than
        ``forget_tombstones_older_than`` go too (their ids then count as new)."""
        if archive is None:
            if store_path(self.env) is None:
                raise InvalidInput("prune on PostgreSQL needs an archive file (--archive FILE)")
            archive = f"{store_path(self.env)}.archive.jsonl.gz"
        now = self.clock()

        def catch_up() -> None:
            catch_up_views([self.recoverable, self.obligation_index])

        return prune_resolved(
            self.retention,
            write_archive,
            cutoff=now - older_than,
            now=now,
            archive=str(archive),
            release=running_release(),
            catch_up=catch_up,
            dry_run=dry_run,
            batch_size=batch_size,
            limit=limit,
            reason=reason,
            forget_tombstones_before=(
                None if forget_tombstones_older_than is None else now - forget_tombstones_older_than
            ),
        )


def open_ledger(
    location: str | Path,
    *,
    owner: OwnerIdentity | None = None,
    policy: LedgerPolicy | None = None,
    clock: Clock = system_clock,
    encrypt: bool | None = None,
    lease: LeaseSettings | None = None,
    existing: bool = False,
    writing: bool = False,
    check_key: bool = True,
    ledger_class: type[DeliveryLedger] = DeliveryLedger,
) -> DeliveryLedger:
    """Open (creating if needed) the store at a file path or a postgresql:// URL, as this
    process (its installation id written beside an SQLite store, or in the state folder,
    the first time), and start the ledger: its lease, where leases are used.

    ``existing=True`` (the operators' commands) opens only a gateway-ledger store that is
    there, read-only if this process cannot write it unless ``writing``.
    """
    env = store_environment(location, existing=existing, writing=writing)
    env, note_release = checked_environment(str(location), env, writes=writing or not existing)
    with opening(location):
        ledger = ledger_class(
            env,
            owner=owner or owner_of(env, persist=True),
            policy=policy,
            clock=clock,
            encrypt=encrypt,
            lease=lease,
            check_key=check_key,
        )
        try:  # under the creation lock: several first opens must not race on its table
            if note_release:
                record_release(dialect_for(ledger.recorder), running_release())
        except BaseException:
            ledger.close()
            raise
    try:
        return ledger.start()
    except BaseException:
        ledger.close()
        raise


def shared_budget_of(ledger: Any) -> SharedBudget | None:
    """The store's shared bot budgets (ADR 0060); None for a ledger without a SQL store
    (in memory: one process, nothing to share)."""
    recorder = getattr(ledger, "recorder", None)
    if getattr(recorder, "datastore", None) is None:
        return None
    return SharedBudget.of(ledger)


class Gateway(delivery_gateway.Gateway):
    """The delivery path over a store-backed ledger, writing through the group-commit
    writer unless given another (the public ``Gateway``)."""

    def __init__(
        self,
        ledger: delivery_ledger.DeliveryLedger,
        *,
        sessions: ResumableSessions | None = None,
        sweep: RecoverySweep | None = None,
        scheduler: Scheduler | None = None,
        command_prefixes: Sequence[str] = DEFAULT_COMMAND_PREFIXES,
        ledger_deadline: float = DEFAULT_LEDGER_DEADLINE,
        writer: EventWriter | None = None,
        write_behind: bool = True,
        budget: SharedBudget | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            ledger,
            writer=writer if writer is not None else GroupCommitWriter(ledger),
            budget=budget if budget is not None else shared_budget_of(ledger),
            sessions=sessions,
            sweep=sweep,
            scheduler=scheduler,
            command_prefixes=command_prefixes,
            ledger_deadline=ledger_deadline,
            write_behind=write_behind,
            **options,  # reconcile_deadline (ADR 0050), share_period (ADR 0060)
        )

    @classmethod
    def open(
        cls,
        location: str | Path,
        *,
        owner: OwnerIdentity | None = None,
        policy: LedgerPolicy | None = None,
        clock: Clock = system_clock,
        **kwargs: Any,
    ) -> Gateway:
        return open_gateway(location, owner=owner, policy=policy, clock=clock, **kwargs)


def open_gateway(
    location: str | Path,
    *,
    owner: OwnerIdentity | None = None,
    policy: LedgerPolicy | None = None,
    clock: Clock = system_clock,
    **kwargs: Any,
) -> Gateway:
    """A gateway on the store at ``location``: its ledger opened and started, the master
    key checked at the gateway's ``start()`` (where a failure is said, not raised)."""
    ledger = open_ledger(location, owner=owner, policy=policy, clock=clock, check_key=False)
    try:
        return Gateway(ledger, **kwargs)
    except BaseException:
        ledger.close()
        raise


# -- erasure, by store location -------------------------------------------------------------


def forget_session(
    location: str | Path,
    session_key: str,
    *,
    requested_by: str = "",
    sessions: str | Path | None = None,
) -> ErasureReport:
    """Erase a session's personal data: the delivery ledger at ``location`` (SQLite or
    PostgreSQL) and the session store, which is looked for at ``location`` too (same file
    or schema) unless ``sessions`` names where it lives."""
    if not str(location):
        raise InvalidInput("forget_session needs a store location")
    session_store = open_sessions_for_erasure(
        location if sessions is None else sessions, required=sessions is not None
    )
    try:
        ledger = open_ledger(location)
    except BaseException:
        if session_store is not None:
            session_store.close()
        raise
    try:
        return forget_in_ledger(
            ledger, session_key, requested_by=requested_by, sessions=session_store
        )
    finally:
        ledger.close()
        if session_store is not None:
            session_store.close()


def finish_erasure_cleanup(location: str | Path, *, sessions: str | Path | None = None) -> bool:
    """Finish what earlier erasures left pending in the store at ``location`` (and in the
    session store at ``sessions``, if it lives elsewhere): the WAL truncation on SQLite,
    ``VACUUM FULL`` of the key table on PostgreSQL. True when nothing is pending any more.

    Like the erasure, it waits about a second at most for a reader to let go, so it can
    run from cron without holding the gateway's writers off (ADR 0028).
    """
    ledger = open_ledger(location)
    try:
        done = ledger.private_mapper.keyring.table.finish_cleanup()
    finally:
        ledger.close()
    if sessions is not None:
        store = open_sessions_for_erasure(sessions, required=True)
        assert store is not None
        try:
            done = store.private_mapper.keyring.table.finish_cleanup() and done
        finally:
            store.close()
    return done


# --- sessions ------------------------------------------------------------------------------
# The session store: the application (application/sessions/store.py) with its ports filled:
# the sealing mapper (PrivateEvents, with the sessions' privacy policy), the transcoder, the
# transcript files, and the secret its keys are hashed with (made on first open, 0600).
class SessionStore(PrivateEvents, SessionsApplication):
    """Conversations keyed by where messages come from, surviving restarts.

    Personal fields are encrypted at rest by default, snapshots included; ``encrypt=False``
    stores new events in clear (upstream compatibility). Reading always decrypts.
    """

    privacy_policy = SESSION_PRIVACY
    transcript_writer = JsonlTranscriptFiles()

    @classmethod
    def open(
        cls,
        location: str | Path,
        *,
        raw_keys: bool = False,
        secret_dir: str | Path | None = None,
        existing: bool = False,
        **options: Any,
    ) -> SessionStore:
        """Open (creating if needed) the store at a file path or a postgresql:// URL.

        Keys are hashed with this installation's secret (created on first use, 0600) unless
        ``raw_keys=True``: upstream's raw keys, for migrating an existing installation.
        ``existing=True`` (the operators' commands) opens only a gateway-ledger store that
        is there, read-only if this process cannot write it.
        """
        return open_sessions(
            location, raw_keys=raw_keys, secret_dir=secret_dir, existing=existing, **options
        )

    def construct_env(self, name: str, env: Any = None) -> Environment:
        environment: Environment = super().construct_env(name, env)
        if self.encrypt is not None:
            environment[ENCRYPT_ENV] = "y" if self.encrypt else "n"
        return environment

    def construct_transcoder(self) -> Transcoder:
        return build_session_transcoder()

    def derived_secret(self, purpose: str) -> bytes:
        return self.private_mapper.keyring.derived_key(purpose)

    def reading_state_only(self) -> AbstractContextManager[None]:
        return self.private_mapper.state_only()

    @property
    def kept(self) -> KeptAggregates:
        return self.decrypted

    # -- retention of ended sessions (ADR 0053) ---------------------------------------------

    @property
    def session_retention(self) -> SqlSessionRetention:
        return SqlSessionRetention(self)

    def session_tombstone(self, session_id: str) -> SessionTombstone | None:
        uuid = session_uuid(require_text("session_id", session_id))
        return self.session_retention.tombstone(uuid)

    def pruned_sessions(self) -> list[SessionTombstone]:
        return self.session_retention.tombstones_all()

    def prune_sessions(
        self,
        older_than: timedelta,
        *,
        archive: str | Path | None = None,
        delete: bool = False,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BATCH,
    ) -> SessionPruneReport:
        """Move ended sessions (no key's current one) that ended longer than
        ``older_than`` ago out of the store: their events to ``archive`` (default:
        ``<store>.archive.jsonl.gz`` beside an SQLite store; required on PostgreSQL), or
        deleted when ``delete=True`` (the operator's explicit choice); a tombstone stays."""
        if delete and archive:
            raise InvalidInput("prune: sessions are archived or deleted, not both")
        if not delete and archive is None:
            if store_path(self.env) is None:
                raise InvalidInput("prune on PostgreSQL needs an archive file (--archive FILE)")
            archive = f"{store_path(self.env)}.archive.jsonl.gz"
        now = self.clock()
        return prune_sessions(
            self,
            self.session_retention,
            write_session_archive,
            cutoff=now - older_than,
            now=now,
            archive="" if delete else str(archive),
            release=running_release(),
            dry_run=dry_run,
            batch_size=batch_size,
        )


def open_sessions(
    location: str | Path,
    *,
    raw_keys: bool = False,
    secret_dir: str | Path | None = None,
    existing: bool = False,
    **options: Any,
) -> SessionStore:
    """The session store at ``location``, its keying checked (``SessionStore.open``).

    ``whatsapp_dir`` (an option): the WhatsApp bridge's session directory, whose LID <->
    phone mapping files make WhatsApp ids canonical in keys."""
    whatsapp_dir = options.pop("whatsapp_dir", None)
    if whatsapp_dir is not None:
        options["whatsapp_aliases"] = BridgeAliasFiles(whatsapp_dir)
    env = store_environment(location, existing=True) if existing else None
    hasher = None
    if not raw_keys:
        hasher = KeyedHasher(load_or_create_secret(secret_path(location, secret_dir)))
    with opening(location):  # concurrent first opens must not race on the tables
        store = SessionStore(
            env or store_environment(location), hasher=hasher, raw_keys=raw_keys, **options
        )
        try:
            if options.get("keying_check", True):
                store.check_keying()
        except BaseException:
            store.close()
            raise
    return store


class SessionKeyingPeek(Application[UUID]):
    """Reads a store's keying record without creating anything."""

    name = SESSIONS_APPLICATION_NAME

    def construct_transcoder(self) -> Transcoder:
        return build_session_transcoder()


def open_session_store(location: str | Path) -> SessionStore | None:
    """The store's SessionStore, opened the way it was created; None if it has no sessions.

    Only an existing gateway-ledger store is opened, read-only when this process may not
    write it (``store_environment(existing=True)``). For the operators' commands."""
    peek = SessionKeyingPeek(
        env={**store_environment(location, existing=True), "CREATE_TABLE": "n"}
    )
    try:
        keying: object = peek.repository.get(SessionKeying.create_id())
    except (AggregateNotFoundError, PersistenceError):
        return None  # no session in this store (on PostgreSQL: not even the sessions' table)
    finally:
        peek.close()
    assert isinstance(keying, SessionKeying)
    return SessionStore.open(location, raw_keys=is_raw_keys_mode(keying.mode), existing=True)


def open_sessions_for_erasure(location: str | Path, *, required: bool) -> SessionStore | None:
    """The session store at ``location`` for erasure, or None if there is none there.

    Opened without creating tables and without the keying check or secret: erasure
    computes no key from a source, it is given the session key.
    """
    env = {**store_environment(location), "CREATE_TABLE": "n"}
    store = SessionStore(env, raw_keys=True, keying_check=False)
    try:
        present = SessionKeying.create_id() in store.repository
    except PersistenceError:
        present = False  # no session tables in this store
    if not present:
        store.close()
        if required:
            raise InvalidInput(f"no session store at {location}")
        return None
    return store


# --- end sessions --------------------------------------------------------------------------


# --- the life of the data: verify, backup, restore, retention -------------------------------

LEDGER_TOPICS = ("gateway_ledger.domain.obligation:", "gateway_ledger.domain.erasure:")
"""The ledger's own events (on SQLite its table holds the sessions' too)."""


def is_postgres_location(location: str | Path) -> bool:
    return is_postgres_url(str(location))


def verify_ledger_store(ledger: DeliveryLedger) -> VerifyReport:
    """``verify`` on an open ledger: its views are compared unless it is read-only."""
    views: list[Any] = [] if ledger.read_only else [ledger.recoverable, ledger.obligation_index]
    return verify_store(StoreChecks(ledger), ledger.private_mapper, LEDGER_TOPICS, views)


def backup_store(
    location: str | Path, dest: str | Path, *, with_keys: bool = False, force: bool = False
) -> dict[str, Any]:
    """An online backup of the SQLite store at ``location`` into ``dest``; the master key
    and session secret beside it are copied only ``with_keys``."""
    source = Path(str(location))
    require_sqlite_store(source)
    pages = backup_sqlite(source, dest, overwrite=force)
    keys = copy_companions(source, Path(dest), KEY_SUFFIXES) if with_keys else []
    return {
        "store": str(source),
        "backup": str(dest),
        "pages": pages,
        "keys": [str(k) for k in keys],
    }


def restore_store(backup: str | Path, location: str | Path, *, force: bool = False) -> int:
    """Restore a backup file into a new SQLite store at ``location`` (refused over an
    existing one unless ``force``); verify it next, then sweep."""
    require_sqlite_store(Path(str(backup)))
    return restore_sqlite(backup, location, overwrite=force)


def archived_timeline(
    ledger: DeliveryLedger, obligation_id: str, archive: str | Path, at: Any = None
) -> Timeline:
    """The timeline of a pruned obligation, from its archived events (decoded with the
    store's keys: the archive keeps them sealed)."""
    uuid = ledger.aggregate_id(obligation_id)
    stream = archived_streams(archive).get(uuid)
    if stream is None:
        raise NotFound("obligation in the archive", obligation_id)
    stored = [StoredEvent(uuid, v, topic, state) for v, topic, state in stream.events]
    return timeline_of(obligation_id, ledger.private_mapper.to_domain_events(stored), at)


def archived_events(
    ledger: DeliveryLedger, archive: str | Path
) -> Iterator[tuple[UUID, int, str, bytes]]:
    """Every archived event as the audit replays it (the last copy of each stream); a
    stream still in the store (archived by a prune that then kept it) is the store's."""
    for stream in archived_streams(archive).values():
        if ledger.recorder.select_events(stream.aggregate_id, limit=1):
            continue
        for version, topic, state in stream.events:
            yield stream.aggregate_id, version, topic, state


def dead_letters_of(ledger: DeliveryLedger) -> SqlDeadLetters:
    return SqlDeadLetters(ledger.obligation_index)


def retention_status(ledger: DeliveryLedger) -> dict[str, Any]:
    """What ``status`` adds: the dead letters (count, oldest age) and, once anything was
    pruned, the number of tombstones."""
    found: dict[str, Any] = {
        "dead_letters": dead_letter_status(dead_letters_of(ledger), ledger.clock())
    }
    pruned = ledger.retention.tombstone_count()
    if pruned:
        found["pruned"] = pruned
    return found


def pacing_status(ledger: DeliveryLedger) -> dict[str, Any]:
    """What ``status`` says of pacing (ADR 0065, 0060): replies recorded and not yet
    attempting by platform (waiting for their turn or the budget, or their platform not
    connected) with the oldest's age, the bot pauses in force and the gateways sharing
    each bot's budget. Read-only: a store no gateway paced yet has nothing to show."""
    now = ledger.clock()
    queued: dict[str, dict[str, Any]] = {}
    for entry in ledger.list(state="pending"):
        figures = queued.setdefault(entry.platform, {"count": 0, "oldest_age_seconds": 0.0})
        figures["count"] += 1
        age = (now - entry.recorded_at).total_seconds()
        figures["oldest_age_seconds"] = round(max(figures["oldest_age_seconds"], age), 3)
    found: dict[str, Any] = {"queued": queued, "pauses": {}, "sharing": {}}
    budget = shared_budget_of(ledger)
    if budget is not None:
        pauses, found["sharing"] = budget.standing()
        found["pauses"] = {p: round(s, 3) for p, s in pauses.items()}
    return found
