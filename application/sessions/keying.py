"""How a store turns a source into its session key, and an inbound message into the ids it
is remembered by; and the check that a store is opened the way its keys were made.

Keys are keyed hashes of the platform ids by default (``hasher``, the installation's
secret), or upstream's raw keys (``raw_keys=True``, for migrating an installation). Inbound
platform message ids are stored only as keyed hashes either way (ADR 0013). How the keys
were made is recorded once per store (``SessionKeying``): opening it another way would
silently start a new session for every conversation, so it is refused instead.
"""

from __future__ import annotations

from gateway_ledger.application.sessions.ports import DerivedSecret
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.privacy.hashing import KeyedHasher
from gateway_ledger.domain.sessions.key import Hasher, build_session_key
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.sessions.whatsapp import AliasLookup

RAW_KEYS_MODE = "raw"
INBOUND_IDS_PURPOSE = "gateway-ledger/inbound-ids/v1"
"""The label of the secret a raw-keys store hashes inbound ids under (never change it: the
stored dedupe marks are found by these hashes)."""


class SessionKeys:
    """The keying of one store: session keys from sources, inbound ids, the keying mode."""

    def __init__(
        self,
        hasher: Hasher | None,
        *,
        group_sessions_per_user: bool,
        thread_sessions_per_user: bool,
        derived_secret: DerivedSecret,
        whatsapp_aliases: AliasLookup | None = None,
    ) -> None:
        """``hasher=None``: upstream's raw keys. ``derived_secret`` is asked only when an
        inbound id of a raw-keys store is first hashed. ``whatsapp_aliases``: the LID <->
        phone table WhatsApp ids are made canonical with (none: each id's own form only)."""
        self.whatsapp_aliases = whatsapp_aliases
        self.hasher = hasher
        self.group_sessions_per_user = group_sessions_per_user
        self.thread_sessions_per_user = thread_sessions_per_user
        self.derived_secret = derived_secret
        self.id_hasher: Hasher | None = hasher

    @property
    def mode(self) -> str:
        """``raw`` or ``keyed:<fingerprint of the secret>`` (``keyed:custom`` for a hasher
        without one): what the store records and compares at open."""
        if self.hasher is None:
            return RAW_KEYS_MODE
        fingerprint = getattr(self.hasher, "fingerprint", None) or "custom"
        return f"keyed:{fingerprint}"

    def key_of(self, source: SessionSource) -> str:
        return build_session_key(
            source,
            group_sessions_per_user=self.group_sessions_per_user,
            thread_sessions_per_user=self.thread_sessions_per_user,
            hasher=self.hasher,
            whatsapp_aliases=self.whatsapp_aliases,
        )

    def inbound_ids(self, chat_id: str, platform_message_id: str) -> tuple[str, str]:
        """Chat and message id of an inbound message as keyed hashes, never in clear.

        Keyed mode hashes with the session secret; raw-keys mode with a key derived from
        the master key (it has no session secret). Either way a guess of chat and message
        id cannot be confirmed without a secret that is not in the store.
        """
        if self.id_hasher is None:
            self.id_hasher = KeyedHasher(self.derived_secret(INBOUND_IDS_PURPOSE))
        return self.id_hasher(chat_id), self.id_hasher(platform_message_id)

    def check_recorded(self, recorded_mode: str) -> None:
        """Refuse a store whose keys were made another way (a lost or swapped secret, or the
        other ``raw_keys`` setting) before any conversation is orphaned."""
        if recorded_mode == self.mode:
            return
        stored = "raw upstream keys" if recorded_mode == RAW_KEYS_MODE else "keyed hashes"
        another = ", another secret" if recorded_mode.startswith("keyed") else ""
        raise InvalidInput(
            f"this session store was created with {stored} ({recorded_mode.split(':')[0]}"
            f"{another}); opening it as {self.mode.split(':')[0]} would orphan every "
            "conversation. Use the original secret file, or the original raw_keys setting."
        )


def is_raw_keys_mode(recorded_mode: str) -> bool:
    """Was a store's keying recorded as raw upstream keys (operators open it that way)?"""
    return recorded_mode.startswith(RAW_KEYS_MODE)
