"""SessionStore: which conversation a message belongs to, persisted as events.

``resolve`` maps a SessionSource to its session key and the key's current session (via a
``SessionRoute`` aggregate per key, ADR 0008), applying the reset policies; ``append`` adds
a message; ``history`` reads the newest messages without replaying the whole conversation.
Every write is one ``save()`` of the aggregates it touches, so it commits atomically and
optimistic concurrency on their versions decides every race.

Personal fields (message text, who and where, the session key) are sealed at rest under the
session key's data key, the same subject as the delivery ledger's (``SESSION_PRIVACY``,
ADR 0012 and ADR 0013); inbound platform message ids are stored only as keyed hashes.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import tzinfo
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID
from zoneinfo import ZoneInfo

import orjson
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError, Transcoder, Transcoding

from gateway_ledger.application.delivery.ledger import VALUE_OBJECTS
from gateway_ledger.application.privacy.erasure import SESSION_PRIVACY
from gateway_ledger.application.sessions.views import (
    AppendResult,
    SessionContext,
    TranscriptMessage,
)
from gateway_ledger.domain.errors import (
    ConcurrentUpdate,
    IllegalTransition,
    InvalidInput,
    NotFound,
    SessionErased,
)
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.key import Hasher, build_session_key, is_path_unsafe
from gateway_ledger.domain.sessions.policy import (
    DEFAULT_AUTO_CONTINUE_SECONDS,
    ResetPolicies,
    ResetReason,
    decide,
)
from gateway_ledger.domain.sessions.route import (
    InboundMessage,
    SessionKeying,
    SessionRoute,
    inbound_uuid,
    route_uuid,
)
from gateway_ledger.domain.sessions.session import (
    MessageAppended,
    Session,
    format_session_id,
    session_uuid,
)
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import require_aware, require_clear_text, require_text
from gateway_ledger.infrastructure.clock import Clock, system_clock
from gateway_ledger.infrastructure.eventstore.library import ENCRYPT_ENV, PrivateEvents
from gateway_ledger.infrastructure.eventstore.store import opening, store_environment
from gateway_ledger.infrastructure.eventstore.transcoder import AttrsTranscoding, OrjsonTranscoder
from gateway_ledger.infrastructure.privacy.private_files import replace_private_file
from gateway_ledger.infrastructure.privacy.secrets import load_or_create_secret, secret_path

log = logging.getLogger("gateway_ledger.sessions")

SESSIONS_APPLICATION_NAME = "gateway_sessions"
"""Part of the stored identity of every event; never change it on an existing store."""

AUTO_CONTINUE_ENV = "GATEWAY_LEDGER_AUTO_CONTINUE_SECONDS"
RAW_KEYS_MODE = "raw"
_RETRIES = 8
_PAGE = 500


class SessionSourceTranscoding(Transcoding):
    """Stores a SessionSource through ``to_dict``/``from_dict``: trust flags never reach disk."""

    type = SessionSource
    name = "SessionSource"

    def encode(self, obj: SessionSource) -> dict[str, Any]:
        return obj.to_dict()

    def decode(self, data: dict[str, Any]) -> SessionSource:
        return SessionSource.from_dict(data)


def build_transcoder() -> Transcoder:
    transcoder = OrjsonTranscoder()
    for cls in VALUE_OBJECTS:
        transcoder.register(AttrsTranscoding(cls))
    transcoder.register(SessionSourceTranscoding())
    return transcoder


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


def random_suffix() -> str:
    return secrets.token_hex(4)


class SessionStore(PrivateEvents, Application[UUID]):
    """Conversations keyed by where messages come from, surviving restarts.

    Personal fields are encrypted at rest by default, snapshots included; ``encrypt=False``
    stores new events in clear (upstream compatibility). Reading always decrypts.
    """

    name = SESSIONS_APPLICATION_NAME
    privacy_policy = SESSION_PRIVACY
    snapshotting_intervals: ClassVar[dict[Any, int]] = {
        Session: 20,
        SessionRoute: 20,
    }

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
    ) -> None:
        """``keying_check=False`` is for maintenance that computes no key from a source
        (erasure): it neither records nor checks how keys are made."""
        if hasher is None and not raw_keys:
            raise InvalidInput(
                "pass hasher= (SessionStore.open makes a keyed one) or raw_keys=True"
            )
        env = dict(env or {})
        if encrypt is not None:
            env[ENCRYPT_ENV] = "y" if encrypt else "n"
        super().__init__(env=env)
        self.hasher = None if raw_keys else hasher
        self.policies = policies or ResetPolicies()
        self.zone: tzinfo = ZoneInfo(timezone) if isinstance(timezone, str) else timezone
        self.auto_continue_seconds = (
            auto_continue_from_env()
            if auto_continue_seconds is None
            else float(auto_continue_seconds)
        )
        self.group_sessions_per_user = group_sessions_per_user
        self.thread_sessions_per_user = thread_sessions_per_user
        self.has_active_processes = has_active_processes
        self.clock = clock
        self.new_suffix = new_suffix
        self._pins: dict[str, int] = {}
        self._id_hasher: Hasher | None = self.hasher
        if keying_check:
            self._check_keying()

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
        env = store_environment(location, existing=True) if existing else None
        hasher = None
        if not raw_keys:
            hasher = KeyedHasher(load_or_create_secret(secret_path(location, secret_dir)))
        with opening(location):
            return cls(
                env or store_environment(location), hasher=hasher, raw_keys=raw_keys, **options
            )

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
        route = self._get_route(key)
        if route is not None:
            session = self._load_session(route.session_id)
            if not session.ended and not session.suspended:
                self.suspend(route.session_id, now=now)
        return sessions

    def construct_transcoder(self) -> Transcoder:
        return build_transcoder()

    # -- keys -----------------------------------------------------------------------------------

    @property
    def keying_mode(self) -> str:
        if self.hasher is None:
            return RAW_KEYS_MODE
        fingerprint = getattr(self.hasher, "fingerprint", None) or "custom"
        return f"keyed:{fingerprint}"

    def _check_keying(self) -> None:
        """Refuse to open a store whose keys were made another way (a lost or swapped secret
        would otherwise start a new session for every conversation, silently)."""
        for _ in range(2):
            try:
                keying: Any = self.repository.get(SessionKeying.create_id())
            except AggregateNotFoundError:
                try:
                    self.save(SessionKeying.establish(mode=self.keying_mode, now=self.clock()))
                    return
                except IntegrityError:
                    continue
            assert isinstance(keying, SessionKeying)
            if keying.mode != self.keying_mode:
                stored = "raw upstream keys" if keying.mode == RAW_KEYS_MODE else "keyed hashes"
                raise InvalidInput(
                    f"this session store was created with {stored} ({keying.mode.split(':')[0]}"
                    f"{', another secret' if keying.mode.startswith('keyed') else ''}); opening "
                    f"it as {self.keying_mode.split(':')[0]} would orphan every conversation. "
                    "Use the original secret file, or the original raw_keys setting."
                )
            return

    def session_key(self, source: SessionSource) -> str:
        return build_session_key(
            source,
            group_sessions_per_user=self.group_sessions_per_user,
            thread_sessions_per_user=self.thread_sessions_per_user,
            hasher=self.hasher,
        )

    def _chat_scope(self, chat_id: str) -> str:
        return self.hasher(chat_id) if self.hasher else chat_id

    def _inbound_ids(self, chat_id: str, platform_message_id: str) -> tuple[str, str]:
        """Chat and message id of an inbound message as keyed hashes, never in clear.

        Keyed mode hashes with the session secret; raw-keys mode with a key derived from
        the master key (it has no session secret). Either way a guess of chat and message
        id cannot be confirmed without a secret that is not in the store.
        """
        if self._id_hasher is None:
            derived = self.private_mapper.keyring.derived_key("gateway-ledger/inbound-ids/v1")
            self._id_hasher = KeyedHasher(derived)
        return self._id_hasher(chat_id), self._id_hasher(platform_message_id)

    # -- pinning --------------------------------------------------------------------------------

    def pin(self, key: str) -> None:
        """A background process works on ``key``'s session: never reset it until unpinned."""
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        count = self._pins.get(key, 0) - 1
        if count > 0:
            self._pins[key] = count
        else:
            self._pins.pop(key, None)

    @contextmanager
    def pinned(self, key: str) -> Iterator[None]:
        self.pin(key)
        try:
            yield
        finally:
            self.unpin(key)

    def is_pinned(self, key: str) -> bool:
        if self._pins.get(key):
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

    # -- resolve --------------------------------------------------------------------------------

    def resolve(self, source: SessionSource, now: Any = None) -> SessionContext:
        """The session ``source`` belongs to now, creating or auto-resetting it as needed."""
        now = require_aware("now", self.clock() if now is None else now)
        key = self.session_key(source)
        for _ in range(_RETRIES):
            route = self._get_route(key)
            if route is None:
                session = self._new_session(key, source, now)
                route = SessionRoute.open(key=key, session_id=session.session_id, now=now)
                if not self._try_save(route, session, starts_afresh=True):
                    continue  # another process opened this key first: join its session
                log.info("session %s opened", session.session_id)
                return self._context(key, session, source, is_new=True)
            session = self._load_session(route.session_id)
            decision = decide(
                pinned=self.is_pinned(key),
                suspended=session.suspended,
                resume_pending=session.resume_pending,
                last_activity=max(session.last_activity_at, session.resume_marked_at or now)
                if session.resume_pending
                else session.last_activity_at,
                now=now,
                policy=self.policies.for_source(source.platform, source.chat_type),
                zone=self.zone,
                auto_continue_seconds=self.auto_continue_seconds,
            )
            if decision.reset_reason is None:
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
        for _ in range(_RETRIES):
            route = self._get_route(key)
            if route is None:
                if source is None:
                    raise NotFound("session key", key)
                return self.resolve(source, now)
            session = self._load_session(route.session_id)
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
        now: Any,
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
        now: Any,
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

    def _context(
        self,
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
        for _ in range(_RETRIES):
            session = self._load_session(context.session_id)
            seq = session.append_message(
                role=role, content=content, now=now, platform_message_id=platform_message_id
            )
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
            messages = list(self._messages(uuid))
        else:
            if isinstance(last, bool) or not isinstance(last, int) or last < 0:
                raise InvalidInput("last must be a non-negative int")
            messages = self._newest_messages(uuid, last)
        if not messages and not self._exists(uuid):
            raise NotFound("session", session_id)
        return messages

    def _newest_messages(self, uuid: UUID, last: int) -> list[TranscriptMessage]:
        found: list[TranscriptMessage] = []
        lte: int | None = None
        while len(found) < last:
            page = list(self.events.get(uuid, lte=lte, desc=True, limit=last - len(found) + 8))
            if not page:
                break
            found.extend(_message(e) for e in page if isinstance(e, MessageAppended))
            lte = page[-1].originator_version - 1
            if lte < 1:
                break
        found.reverse()
        return found[-last:] if last else []

    def _messages(self, uuid: UUID) -> Iterator[TranscriptMessage]:
        gt: int | None = None
        while True:
            page = list(self.events.get(uuid, gt=gt, limit=_PAGE))
            for e in page:
                if isinstance(e, MessageAppended):
                    yield _message(e)
            if len(page) < _PAGE:
                return
            gt = page[-1].originator_version

    def export_transcript(self, session_id: str, directory: str | Path) -> Path:
        """Write ``<directory>/<session_id>.jsonl`` (one message per line, orjson).

        The session id becomes a file name, so it must pass the strict path guard.
        """
        if not isinstance(session_id, str) or not session_id or is_path_unsafe(session_id):
            raise InvalidInput(f"refused to export {session_id!r}: not a safe file name")
        uuid = self._session_uuid(session_id)
        if not self._exists(uuid):
            raise NotFound("session", session_id)
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        # The transcript is personal data: written owner-only, through a temporary that
        # never follows a planted symlink and is removed if anything fails.
        target = folder / f"{session_id}.jsonl"
        count = replace_private_file(
            target,
            (orjson.dumps(message.to_dict()) + b"\n" for message in self._messages(uuid)),
        )
        log.info("session %s exported: %d messages", session_id, count)
        return target

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
        for _ in range(_RETRIES):
            session = self._load_session(session_id)
            change(session)
            if self._try_save(session):
                return
        raise ConcurrentUpdate("Session", session_id, what)

    # -- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _session_uuid(session_id: str) -> UUID:
        require_text("session_id", session_id)
        return session_uuid(session_id)

    def _exists(self, uuid: UUID) -> bool:
        return uuid in self.repository

    def _get(self, uuid: UUID) -> Any:
        try:
            with self.private_mapper.state_only():  # messages' text is not state: not opened
                return self.repository.get(uuid)
        except AggregateNotFoundError:
            return None

    def _get_route(self, key: str) -> SessionRoute | None:
        route = self._get(route_uuid(key))
        assert route is None or isinstance(route, SessionRoute)
        return route

    def _load_session(self, session_id: str) -> Session:
        session = self._get(self._session_uuid(session_id))
        if session is None:
            raise NotFound("session", session_id)
        assert isinstance(session, Session)
        return session

    def _try_save(self, *aggregates: Aggregate, starts_afresh: bool = False) -> bool:
        """Save atomically; False if another writer got there first (caller reloads).

        ``starts_afresh``: the save starts a new session. If the key's data key was
        destroyed meanwhile (an erasure in another process, ``SessionErased``), it is
        forgotten here by now, and the caller's retry seals the new session under a new
        key: a message that arrives after an erasure is new data (ADRs 0012, 0028).
        """
        try:
            self.save(*aggregates)
        except IntegrityError:
            log.debug("lost a race on %s; reloading", [type(a).__name__ for a in aggregates])
            return False
        except SessionErased:
            if not starts_afresh:
                raise
            log.info("session key erased meanwhile; the new session starts a new key")
            return False
        return True


def _message(e: Any) -> TranscriptMessage:
    return TranscriptMessage(
        seq=e.seq,
        role=e.role,
        content=e.content,
        platform_message_id=e.platform_message_id,
        timestamp=e.timestamp,
    )
