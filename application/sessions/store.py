"""The session store: which conversation a message belongs to, persisted as events.

``resolve`` maps a SessionSource to its session key and the key's current session (via a
``SessionRoute`` aggregate per key, ADR 0008), applying the reset policies; ``append`` adds
a message; ``history`` reads the newest messages without replaying the whole conversation.
Every write is one ``save()`` of the aggregates it touches, so it commits atomically and
optimistic concurrency on their versions decides every race.

This module holds the conversations and their reset rules. How keys and inbound ids are
made is ``keying.py``, reading transcripts ``transcripts.py``, pins ``pins.py``. Nothing here
touches a file, a secret or a connection: the composition root (``gateway_ledger/bootstrap.py``)
subclasses :class:`SessionsApplication` with the sealing mapper, the transcoder and the
transcript writer, and opens it (``SessionStore.open``). Personal fields are sealed at rest
there, under the session key's data key (ADR 0012, ADR 0013).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID
from zoneinfo import ZoneInfo

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError
from eventsourcing.utils import get_topic

from gateway_ledger.application.clock import Clock, system_clock
from gateway_ledger.application.privacy.ports import KeptAggregates
from gateway_ledger.application.sessions.importing import ImportedKey, key_aggregates
from gateway_ledger.application.sessions.keying import SessionKeys
from gateway_ledger.application.sessions.pins import SessionPins
from gateway_ledger.application.sessions.ports import EventAppender, TranscriptWriter
from gateway_ledger.application.sessions.prompt import HomeChannel, build_session_context_prompt
from gateway_ledger.application.sessions.transcripts import TranscriptReader
from gateway_ledger.application.sessions.views import (
    AppendResult,
    SessionContext,
    SessionStatus,
    TranscriptMessage,
)
from gateway_ledger.domain.errors import (
    ConcurrentUpdate,
    IllegalTransition,
    InvalidInput,
    LedgerError,
    NotFound,
    SessionErased,
)
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.key import (
    Hasher,
    is_path_unsafe,
    is_shared_multi_user_session,
)
from gateway_ledger.domain.sessions.policy import (
    DEFAULT_AUTO_CONTINUE_SECONDS,
    ResetPolicies,
    ResetReason,
    decide,
)
from gateway_ledger.domain.sessions.retention import SessionTombstone
from gateway_ledger.domain.sessions.route import (
    InboundMessage,
    SessionKeying,
    SessionRoute,
    inbound_uuid,
    route_uuid,
)
from gateway_ledger.domain.sessions.session import Session, format_session_id, session_uuid
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.sessions.whatsapp import AliasLookup
from gateway_ledger.domain.values import require_aware, require_clear_text, require_text

log = logging.getLogger("gateway_ledger.sessions")

SESSIONS_APPLICATION_NAME = "gateway_sessions"
"""Part of the stored identity of every event; never change it on an existing store."""

AUTO_CONTINUE_ENV = "GATEWAY_LEDGER_AUTO_CONTINUE_SECONDS"
PROMPT_IDS_PURPOSE = "gateway-ledger/prompt-ids/v1"
"""The label of the secret a raw-keys store hashes the ids in a context block under."""
AUTOMATIC_RESETS = frozenset(
    {
        ResetReason.IDLE.value,
        ResetReason.DAILY.value,
        ResetReason.SUSPENDED.value,
        ResetReason.RESUME_PENDING_EXPIRED.value,
    }
)
RETRIES = 8


def auto_continue_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The freshness window from ``GATEWAY_LEDGER_AUTO_CONTINUE_SECONDS`` (default 3600 s)."""
    raw = (os.environ if environ is None else environ).get(AUTO_CONTINUE_ENV, "")
    if not raw.strip():
        return DEFAULT_AUTO_CONTINUE_SECONDS
    try:
        return float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; using %s s", AUTO_CONTINUE_ENV, raw, 3600)
        return DEFAULT_AUTO_CONTINUE_SECONDS


class _NothingKept:
    """Keeps nothing: every change reads its aggregate as stored."""

    def take(self, aggregate_id: UUID) -> Any | None:
        return None

    def keep(self, aggregate: Any) -> None:
        return None


NOTHING_KEPT: KeptAggregates = _NothingKept()


def random_suffix() -> str:
    return secrets.token_hex(4)


class SessionsApplication(Application[UUID]):
    """Conversations keyed by where messages come from, surviving restarts.

    The composition root's ``SessionStore`` is this class with its ports filled: the
    transcoder (``construct_transcoder``), the sealing mapper, :attr:`transcript_writer`,
    :meth:`derived_secret` and :meth:`reading_state_only`.
    """

    name = SESSIONS_APPLICATION_NAME
    snapshotting_intervals: ClassVar[dict[Any, int]] = {
        Session: 20,
        SessionRoute: 20,
    }
    transcript_writer: ClassVar[TranscriptWriter | None] = None
    """Writes exported transcripts (``export_transcript``); set by the composition root."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The library names an application after its class; a subclass that fills the
        ports keeps the stored name (its PostgreSQL tables, every event's identity)."""
        super().__init_subclass__(**kwargs)
        cls.name = SESSIONS_APPLICATION_NAME

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        hasher: Hasher | None = None,
        raw_keys: bool = False,
        policies: ResetPolicies | None = None,
        timezone: str | tzinfo = "UTC",
        auto_continue_seconds: float | None = None,
        group_sessions_per_user: bool = True,
        thread_sessions_per_user: bool = False,
        has_active_processes: Callable[[str], bool] | None = None,
        clock: Clock = system_clock,
        new_suffix: Callable[[], str] = random_suffix,
        encrypt: bool | None = None,
        keying_check: bool = True,
        whatsapp_aliases: AliasLookup | None = None,
    ) -> None:
        """Keys are keyed hashes under ``hasher`` unless ``raw_keys=True``. ``encrypt``:
        whether new events are sealed at rest (None: as the store's environment says).

        Nothing is read or written here beyond what the library's ``Application`` does
        when it is built: how the store's keys were made is checked by ``check_keying``
        (``SessionStore.open`` calls it), else before the first key is made from a source.
        ``keying_check=False`` is for maintenance that computes no key from a source
        (erasure): it neither records nor checks how keys are made."""
        if hasher is None and not raw_keys:
            raise InvalidInput(
                "pass hasher= (SessionStore.open makes a keyed one) or raw_keys=True"
            )
        self.keys = SessionKeys(
            None if raw_keys else hasher,
            group_sessions_per_user=group_sessions_per_user,
            thread_sessions_per_user=thread_sessions_per_user,
            derived_secret=self.derived_secret,
            whatsapp_aliases=whatsapp_aliases,
        )
        self.pins = SessionPins(has_active_processes)
        self.policies = policies or ResetPolicies()
        self.zone: tzinfo = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
        self.auto_continue_seconds = (
            auto_continue_from_env()
            if auto_continue_seconds is None
            else float(auto_continue_seconds)
        )
        self.clock = clock
        self.new_suffix = new_suffix
        self.encrypt = encrypt
        self._keying_checked = not keying_check
        super().__init__(env=dict(env or {}))
        self.transcripts = TranscriptReader(self.events)

    # -- ports the composition root fills -------------------------------------------------------

    def derived_secret(self, purpose: str) -> bytes:
        """A secret derived from the store's master key for ``purpose`` (see ports.py)."""
        raise LedgerError("this session store has no master key to derive a secret from")

    @property
    def sealed_events(self) -> EventAppender:
        """The write path of bulk writes (``import_keys``); the composition root's store is
        the sealed event store, whose ``append`` reports no notification ids."""
        raise LedgerError("this session store has no bulk write path")

    def pruned_sessions(self) -> list[SessionTombstone]:
        """The tombstones of the sessions pruned from this store (ADR 0053), oldest end
        first; the composition root's store reads them from its table."""
        return []

    def session_tombstone(self, session_id: str) -> SessionTombstone | None:
        """What stays of a pruned session (None: not pruned)."""
        return None

    def reading_state_only(self) -> AbstractContextManager[None]:
        """Within: aggregates are rebuilt without opening what their state never reads (the
        text of messages); a sealing mapper honours it, a plain one has nothing to skip."""
        return contextlib.nullcontext()

    def store(self, *aggregates: Aggregate) -> None:
        """Save, without the library's ``Recording``s (the composition root's store then
        asks the recorder for no notification ids: a shorter write on PostgreSQL)."""
        self.save(*aggregates)

    @property
    def kept(self) -> KeptAggregates:
        """The sessions a ``resolve`` read, kept for the ``append`` after it (one read of
        the session instead of two); the composition root's store keeps them decrypted
        and forgets them with their key. Here: nothing is kept."""
        return NOTHING_KEPT

    # -- keys -----------------------------------------------------------------------------------

    @property
    def hasher(self) -> Hasher | None:
        return self.keys.hasher

    @property
    def group_sessions_per_user(self) -> bool:
        return self.keys.group_sessions_per_user

    @property
    def thread_sessions_per_user(self) -> bool:
        return self.keys.thread_sessions_per_user

    @property
    def keying_mode(self) -> str:
        return self.keys.mode

    def check_keying(self) -> None:
        """Record how this store's keys are made, or refuse if they were made another way (a
        lost or swapped secret would otherwise start a new session for every conversation,
        silently)."""
        for _ in range(2):
            try:
                keying: object = self.repository.get(SessionKeying.create_id())
            except AggregateNotFoundError:
                try:
                    self.save(SessionKeying.establish(mode=self.keying_mode, now=self.clock()))
                except IntegrityError:
                    continue  # another process recorded it first: compare with theirs
                break
            assert isinstance(keying, SessionKeying)
            self.keys.check_recorded(keying.mode)
            break
        self._keying_checked = True

    def session_key(self, source: SessionSource) -> str:
        if not self._keying_checked:
            self.check_keying()
        return self.keys.key_of(source)

    def _inbound_ids(self, chat_id: str, platform_message_id: str) -> tuple[str, str]:
        if not self._keying_checked:
            self.check_keying()
        return self.keys.inbound_ids(chat_id, platform_message_id)

    # -- pinning --------------------------------------------------------------------------------

    @property
    def has_active_processes(self) -> Callable[[str], bool] | None:
        return self.pins.has_active_processes

    def pin(self, key: str) -> None:
        """A background process works on ``key``'s session: never reset it until unpinned."""
        self.pins.pin(key)

    def unpin(self, key: str) -> None:
        self.pins.unpin(key)

    def pinned(self, key: str) -> AbstractContextManager[None]:
        return self.pins.pinned(key)

    def is_pinned(self, key: str) -> bool:
        return self.pins.is_pinned(key)

    # -- resolve --------------------------------------------------------------------------------

    def resolve(self, source: SessionSource, now: Any = None) -> SessionContext:
        """The session ``source`` belongs to now, creating or auto-resetting it as needed."""
        now = require_aware("now", self.clock() if now is None else now)
        key = self.session_key(source)
        for _ in range(RETRIES):
            route = self.route_of(key)
            if route is None:
                session = self._new_session(key, source, now)
                route = SessionRoute.open(key=key, session_id=session.session_id, now=now)
                if not self._try_save(route, session, starts_afresh=True):
                    continue  # another process opened this key first: join its session
                self.kept.keep(session)
                log.info("session %s opened", session.session_id)
                return self._context(key, session, source, is_new=True)
            session = self.load_session(route.session_id)
            decision = decide(
                pinned=self.is_pinned(key),
                suspended=session.suspended,
                resume_pending=session.resume_pending,
                last_activity=session.last_activity_at,
                resume_marked_at=session.resume_marked_at,
                now=now,
                policy=self.policies.for_source(source.platform, source.chat_type),
                zone=self.zone,
                auto_continue_seconds=self.auto_continue_seconds,
            )
            if decision.reset_reason is None:
                self.kept.keep(session)  # for the append that follows
                return self._context(
                    key, session, source, should_auto_continue=decision.should_auto_continue
                )
            successor = self._rotate(key, route, session, source, decision.reset_reason, now)
            if successor is None:
                continue
            return self._context(key, successor, source, is_new=True, auto_reset=True)
        raise ConcurrentUpdate("SessionRoute", key, "resolve")

    def reset(
        self,
        key_or_source: str | SessionSource,
        reason: ResetReason | str = ResetReason.SESSION_RESET,
        now: Any = None,
    ) -> SessionContext:
        """Manual ``/new`` or ``/reset``: the key continues in a fresh session.

        Refused while a background process pins the session (it is never reset under it).
        """
        now = require_aware("now", self.clock() if now is None else now)
        try:
            reset_reason = ResetReason(reason)
        except ValueError:
            raise InvalidInput(f"unknown reset reason {reason!r}") from None
        if isinstance(key_or_source, SessionSource):
            key, source = self.session_key(key_or_source), key_or_source
        else:
            key, source = require_text("session key", key_or_source), None
        if self.is_pinned(key):
            raise IllegalTransition(
                "SessionRoute", key, "pinned by an active background process", "reset"
            )
        for _ in range(RETRIES):
            route = self.route_of(key)
            if route is None:
                if source is None:
                    raise NotFound("session key", key)
                return self.resolve(source, now)
            session = self.load_session(route.session_id)
            successor = self._rotate(
                key, route, session, source or session.source, reset_reason, now
            )
            if successor is not None:
                return self._context(key, successor, successor.source, is_new=True)
        raise ConcurrentUpdate("SessionRoute", key, "reset")

    def _rotate(
        self,
        key: str,
        route: SessionRoute,
        session: Session,
        source: SessionSource,
        reason: ResetReason,
        now: datetime,
    ) -> Session | None:
        # ``key``, not ``route.key``: after an erasure the stored key reads ``[erased]``.
        successor = self._new_session(key, source, now, session.session_id, reason)
        session.reset(reason=reason, successor_session_id=successor.session_id, now=now)
        route.rotate(session_id=successor.session_id, reason=reason, now=now)
        if not self._try_save(route, session, successor, starts_afresh=True):
            return None
        log.info(
            "session %s reset (%s); continues in %s",
            session.session_id,
            reason.value,
            successor.session_id,
        )
        return successor

    def _new_session(
        self,
        key: str,
        source: SessionSource,
        now: datetime,
        previous: str | None = None,
        reason: ResetReason | None = None,
    ) -> Session:
        return Session.start(
            session_id=format_session_id(now, self.new_suffix()),
            key=key,
            source=source,
            now=now,
            previous_session_id=previous,
            reason=reason,
        )

    @staticmethod
    def _context(
        key: str,
        session: Session,
        source: SessionSource,
        *,
        is_new: bool = False,
        auto_reset: bool = False,
        should_auto_continue: bool = False,
    ) -> SessionContext:
        return SessionContext(
            key=key,
            session_id=session.session_id,
            source=source,
            created_at=session.created_at,
            updated_at=session.last_activity_at,
            message_count=session.message_count,
            is_new=is_new,
            auto_reset=auto_reset,
            reset_reason=session.started_reason if is_new else None,
            previous_session_id=session.previous_session_id,
            should_auto_continue=should_auto_continue,
        )

    # -- switching, looking up, reading back -----------------------------------------------------

    def switch_session(
        self, key: str, target_session_id: str, now: Any = None
    ) -> SessionContext | None:
        """Make an earlier session current for ``key`` (``/resume``): None for an unknown key;
        unchanged when it is current already. The session left ends (``session_switch``),
        the target is reopened if it had ended; several keys may share one session."""
        now = require_aware("now", self.clock() if now is None else now)
        require_text("session key", key)
        if self.is_pinned(key):
            raise IllegalTransition(
                "SessionRoute", key, "pinned by an active background process", "switched"
            )
        for _ in range(RETRIES):
            route = self.route_of(key)
            if route is None:
                return None
            if route.session_id == target_session_id:
                current = self.load_session(route.session_id)
                return self._context(key, current, current.source)
            target = self.load_session(target_session_id)
            left = self.load_session(route.session_id)
            changed: list[Aggregate] = [route, target]
            if not left.ended:
                left.reset(
                    reason=ResetReason.SESSION_SWITCH,
                    successor_session_id=target.session_id,
                    now=now,
                )
                changed.append(left)
            target.reopen(reason=ResetReason.SESSION_SWITCH, now=now)
            route.rotate(session_id=target.session_id, reason=ResetReason.SESSION_SWITCH, now=now)
            if self._try_save(*changed):
                log.info("key switched from %s to %s", left.session_id, target.session_id)
                return self._context(key, target, target.source)
        raise ConcurrentUpdate("SessionRoute", key, "switch")

    def status(self, key: str) -> SessionStatus | None:
        """The key's current session and why it is as it is; None for an unknown key."""
        route = self.route_of(require_text("session key", key))
        if route is None:
            return None
        return self._status(key, self.load_session(route.session_id))

    def lookup_by_session_id(self, session_id: str) -> SessionStatus | None:
        """The session with this id (upstream's ``lookup_by_session_id``); None if unknown."""
        session = self._get(self._session_uuid(session_id))
        if session is None:
            return None
        assert isinstance(session, Session)
        return self._status(session.key, session)

    def peek_session_id(self, key: str) -> str | None:
        """The key's current session id, without resolving or resetting anything."""
        route = self.route_of(require_text("session key", key))
        return None if route is None else route.session_id

    def has_any_sessions(self) -> bool:
        """Upstream's ``has_any_sessions``: more than one session exists. Its gateway asks
        after the current message's session was made, to tell an installation that has had
        conversations before from a brand-new one."""
        started = self.recorder.select_notifications(
            0, 2, topics=[get_topic(Session.Started)], inclusive_of_start=False
        )
        return len(started) > 1

    @staticmethod
    def _status(key: str, session: Session) -> SessionStatus:
        reason = session.started_reason
        return SessionStatus(
            key=key,
            session_id=session.session_id,
            created_at=session.created_at,
            updated_at=session.last_activity_at,
            message_count=session.message_count,
            suspended=session.suspended,
            resume_pending=session.resume_pending,
            resume_reason=session.resume_reason,
            resume_marked_at=session.resume_marked_at if session.resume_pending else None,
            was_auto_reset=reason in AUTOMATIC_RESETS,
            auto_reset_reason=reason,
            previous_session_id=session.previous_session_id,
            ended=session.ended,
            end_reason=session.end_reason,
        )

    def context_prompt(
        self,
        context: SessionContext,
        *,
        connected_platforms: Any = (),
        home_channels: Any = (),
        redact: bool = True,
    ) -> str:
        """The session-context block for the agent's prompt (``prompt.py``); personal ids
        are shown as this store's keyed hashes unless ``redact=False``."""
        source = context.source
        shared = is_shared_multi_user_session(
            source,
            group_sessions_per_user=self.group_sessions_per_user,
            thread_sessions_per_user=self.thread_sessions_per_user,
        )
        hasher = None
        if redact:
            hasher = self.hasher or KeyedHasher(self.derived_secret(PROMPT_IDS_PURPOSE))
        return build_session_context_prompt(
            source,
            connected_platforms=connected_platforms,
            home_channels=[
                h if isinstance(h, HomeChannel) else HomeChannel(**h) for h in home_channels
            ],
            shared=shared,
            redact=hasher,
        )

    # -- importing an existing installation (importing.py) ------------------------------------

    def key_of_imported(self, imported: ImportedKey) -> str:
        """The key an imported one has here: upstream's raw key kept in a raw-keys store,
        else the keyed hash of its current session's source (from here on)."""
        if self.hasher is None:
            return imported.key
        return self.session_key(imported.current.source)

    def import_keys(
        self,
        keys: Sequence[ImportedKey],
        *,
        dry_run: bool = False,
        refused: list[tuple[ImportedKey, str]] | None = None,
    ) -> list[tuple[ImportedKey, str]]:
        """Save each key not yet in this store with its sessions, in one transaction per
        batch (per key when a batch meets one imported meanwhile); returns what was
        imported, with the key each got here. A key already here is skipped whole, so a
        second run, or a run after a killed one, imports only what is missing.
        ``dry_run``: everything is built and checked, nothing saved. ``refused``: where a
        key the store would refuse (its content, say) is noted, instead of raising."""
        pending: list[tuple[ImportedKey, str, list[Any]]] = []
        for imported in keys:
            key = self.key_of_imported(imported)
            if self.recorder.select_events(route_uuid(key), limit=1):
                continue  # imported before (its route's first event is stored)
            try:
                aggregates = key_aggregates(imported, key, self._inbound_ids)
            except LedgerError as e:  # what a live store would refuse: nothing of the key
                if refused is None:
                    raise
                refused.append((imported, str(e)))
                continue
            pending.append((imported, key, [e for a in aggregates for e in a.collect_events()]))
        if dry_run:
            return [(imported, key) for imported, key, _ in pending]
        # Through the event store, not ``save``: the library would take every 20th event's
        # snapshot at once, reloading each session; the live store takes them as it goes.
        try:
            self.sealed_events.append([e for _, _, events in pending for e in events])
        except IntegrityError:
            done = []
            for imported, key, events in pending:
                try:
                    self.sealed_events.append(events)
                except IntegrityError:
                    continue  # imported meanwhile (another run): skipped whole
                done.append((imported, key))
            return done
        return [(imported, key) for imported, key, _ in pending]

    # -- messages -------------------------------------------------------------------------------

    def append(
        self,
        context: SessionContext,
        role: str,
        content: str,
        platform_message_id: str | None = None,
        now: Any = None,
    ) -> AppendResult:
        """Append a message to the context's session (one transaction with its dedupe mark)."""
        now = require_aware("now", self.clock() if now is None else now)
        if not isinstance(context, SessionContext):
            raise InvalidInput("context must be a SessionContext from resolve()")
        source = context.source
        uuid = self._session_uuid(context.session_id)
        for attempt in range(RETRIES):
            # The first try on the copy ``resolve`` kept, if any: a copy behind the store
            # fails on its version below, and the next try reads the session as stored.
            kept = self.kept.take(uuid) if attempt == 0 else None
            session = kept if isinstance(kept, Session) else self.load_session(context.session_id)
            try:
                seq = session.append_message(
                    role=role, content=content, now=now, platform_message_id=platform_message_id
                )
            except IllegalTransition:
                if session is not kept:
                    raise
                continue  # refused on the copy: the session as stored decides
            marker = None
            if platform_message_id is not None:
                chat_ref, message_ref = self._inbound_ids(source.chat_id, platform_message_id)
                marker = InboundMessage.record(
                    platform=source.platform,
                    chat_scope=chat_ref,
                    platform_message_id=message_ref,
                    session_id=session.session_id,
                    seq=seq,
                    now=now,
                )
            if self._try_save(session, *([marker] if marker else [])):
                self.kept.keep(session)
                return AppendResult(session.session_id, seq, duplicate=False)
            if marker is not None:
                earlier = self._get(marker.id)
                if isinstance(earlier, InboundMessage):
                    log.info("message %s already in session %s", seq, earlier.session_id)
                    return AppendResult(earlier.session_id, earlier.seq, duplicate=True)
        raise ConcurrentUpdate("Session", context.session_id, "append")

    def seen(
        self,
        platform: str | SessionSource,
        platform_message_id: str,
        chat_id: str | None = None,
    ) -> bool:
        """Was this inbound platform message taken into a session already (any process, any
        time)? Message ids are unique only per chat on some platforms (Telegram), so the chat
        is part of the question: pass the SessionSource, or the platform and ``chat_id``."""
        if isinstance(platform, SessionSource):
            chat_id = platform.chat_id
            platform = platform.platform
        if chat_id is None:
            raise InvalidInput("seen() needs the chat: pass a SessionSource or chat_id=")
        require_clear_text("platform", platform)
        require_text("platform_message_id", platform_message_id)
        chat = require_text("chat_id", str(chat_id))
        chat_ref, message_ref = self._inbound_ids(chat, platform_message_id)
        return inbound_uuid(platform, chat_ref, message_ref) in self.repository

    def history(self, session_id: str, last: int | None = None) -> list[TranscriptMessage]:
        """The session's messages in order; ``last=N`` reads only the newest N from the store."""
        uuid = self._session_uuid(session_id)
        if last is None:
            messages = list(self.transcripts.messages(uuid))
        else:
            if isinstance(last, bool) or not isinstance(last, int) or last < 0:
                raise InvalidInput("last must be a non-negative int")
            messages = self.transcripts.newest(uuid, last)
        if not messages and uuid not in self.repository:
            raise NotFound("session", session_id)
        return messages

    def export_transcript(self, session_id: str, directory: str | Path) -> Path:
        """Write ``<directory>/<session_id>.jsonl`` (one message per line), owner-only.

        The session id becomes a file name, so it must pass the strict path guard. The
        messages are read here; the file is written by the :attr:`transcript_writer`.
        """
        if not isinstance(session_id, str) or not session_id or is_path_unsafe(session_id):
            raise InvalidInput(f"refused to export {session_id!r}: not a safe file name")
        uuid = self._session_uuid(session_id)
        if uuid not in self.repository:
            raise NotFound("session", session_id)
        writer = self.transcript_writer
        if writer is None:
            raise LedgerError("this session store has no transcript writer")
        return writer.write_transcript(Path(directory), session_id, self.transcripts.messages(uuid))

    # -- lifecycle markers ----------------------------------------------------------------------

    def mark_resume_pending(
        self, session_id: str, reason: str = "restart", now: Any = None
    ) -> None:
        """A turn was interrupted: after a restart, ``resolve`` says whether to auto-continue."""
        now = require_aware("now", self.clock() if now is None else now)
        self._update(
            session_id, "resume marked", lambda s: s.mark_resume_pending(now=now, reason=reason)
        )

    def clear_resume_pending(self, session_id: str, now: Any = None) -> None:
        now = require_aware("now", self.clock() if now is None else now)
        self._update(session_id, "resume cleared", lambda s: s.clear_resume_pending(now=now))

    def suspend(self, session_id: str, now: Any = None) -> None:
        """``/stop``: the next message to this key starts a new session (``suspended``)."""
        now = require_aware("now", self.clock() if now is None else now)
        self._update(session_id, "suspended", lambda s: s.suspend(now=now))

    def _update(self, session_id: str, what: str, change: Callable[[Session], None]) -> None:
        for _ in range(RETRIES):
            session = self.load_session(session_id)
            change(session)
            if self._try_save(session):
                return
        raise ConcurrentUpdate("Session", session_id, what)

    # -- erasure (the session half of ``privacy.forget_session``) ------------------------------

    def sessions_of(self, key: str) -> list[str]:
        """Every session id the key has had, oldest first (from its route; no key needed)."""
        found: list[str] = []
        for e in self.events.get(route_uuid(require_text("session key", key))):
            session_id = getattr(e, "session_id", None)
            if isinstance(session_id, str) and session_id not in found:
                found.append(session_id)
        return found

    def end_for_erasure(self, key: str, now: Any = None) -> list[str]:
        """Suspend the key's open session, so the next message starts a fresh one rather
        than continuing a transcript that reads ``[erased]``. Returns the key's sessions."""
        now = require_aware("now", self.clock() if now is None else now)
        sessions = self.sessions_of(key)
        route = self.route_of(key)
        if route is not None:
            session = self.load_session(route.session_id)
            if not session.ended and not session.suspended:
                self.suspend(route.session_id, now=now)
        return sessions

    # -- reading aggregates ---------------------------------------------------------------------

    def route_of(self, key: str) -> SessionRoute | None:
        """The route of a session key (its current session), or None for a key never seen."""
        route = self._get(route_uuid(key))
        assert route is None or isinstance(route, SessionRoute)
        return route

    def load_session(self, session_id: str) -> Session:
        """The session with this id, rebuilt from its snapshot and events; NotFound if none."""
        session = self._get(self._session_uuid(session_id))
        if session is None:
            raise NotFound("session", session_id)
        assert isinstance(session, Session)
        return session

    @staticmethod
    def _session_uuid(session_id: str) -> UUID:
        require_text("session_id", session_id)
        return session_uuid(session_id)

    def _get(self, uuid: UUID) -> Aggregate | None:
        try:
            with self.reading_state_only():  # messages' text is not state: not opened
                aggregate: object = self.repository.get(uuid)
        except AggregateNotFoundError:
            return None
        assert isinstance(aggregate, Aggregate)
        return aggregate

    def _try_save(self, *aggregates: Aggregate, starts_afresh: bool = False) -> bool:
        """Save atomically; False if another writer got there first (caller reloads).

        ``starts_afresh``: the save starts a new session. If the key's data key was
        destroyed meanwhile (an erasure in another process, ``SessionErased``), it is
        forgotten here by now, and the caller's retry seals the new session under a new
        key: a message that arrives after an erasure is new data (ADRs 0012, 0028).
        """
        try:
            self.store(*aggregates)
        except IntegrityError:
            log.debug("lost a race on %s; reloading", [type(a).__name__ for a in aggregates])
            return False
        except SessionErased:
            if not starts_afresh:
                raise
            log.info("session key erased meanwhile; the new session starts a new key")
            return False
        return True
