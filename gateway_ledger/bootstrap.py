"""The composition root: where infrastructure is wired into the application's ports.

Each block below opens one capability on a real store. Nothing is started in a
constructor; what is opened here is closed by the object's ``close()``.
"""

from __future__ import annotations

# --- sessions ------------------------------------------------------------------------------
# The session store: the application (application/sessions/store.py) with its ports filled:
# the sealing mapper (PrivateEvents, with the sessions' privacy policy), the transcoder, the
# transcript files, and the secret its keys are hashed with (made on first open, 0600).
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import PersistenceError, Transcoder
from eventsourcing.utils import Environment

from gateway_ledger.application.privacy.erasure import SESSION_PRIVACY
from gateway_ledger.application.sessions.keying import is_raw_keys_mode
from gateway_ledger.application.sessions.store import (
    SESSIONS_APPLICATION_NAME,
    SessionsApplication,
)
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.route import SessionKeying
from gateway_ledger.infrastructure.eventstore.store import opening, store_environment
from gateway_ledger.infrastructure.privacy.private_mapper import ENCRYPT_ENV, PrivateEvents
from gateway_ledger.infrastructure.privacy.secrets import load_or_create_secret, secret_path
from gateway_ledger.infrastructure.sessions.transcoding import build_session_transcoder
from gateway_ledger.infrastructure.sessions.transcript_files import JsonlTranscriptFiles


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


def open_sessions(
    location: str | Path,
    *,
    raw_keys: bool = False,
    secret_dir: str | Path | None = None,
    existing: bool = False,
    **options: Any,
) -> SessionStore:
    """The session store at ``location``, its keying checked (``SessionStore.open``)."""
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
