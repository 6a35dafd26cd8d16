"""Identifier hashing: the upstream formulas, verbatim, plus a keyed (HMAC) variant.

Upstream hashes platform ids with unkeyed SHA-256 cut to 12 hex characters. That keeps raw
ids off disk but not out of reach: anyone holding the store can enumerate every phone
number or numeric id and compare. The keyed variant takes a per-installation secret, so
the same person still maps to the same value across restarts and devices, yet the
mapping cannot be rebuilt without the secret. The secret itself is made and kept by
``infrastructure/sessions/secrets.py``; here it is only an argument.
"""

from __future__ import annotations

import hashlib
import hmac

import attrs

from gateway_ledger.domain.errors import InvalidInput

KEYED_HASH_HEX = 24
"""96 bits: a collision would merge two people's conversations, so longer than upstream's 12."""

MIN_SECRET_BYTES = 16
FINGERPRINT_LABEL = "gateway-ledger/session-secret-fingerprint/v1"


def hash_id(value: str) -> str:
    """Deterministic 12-char hex hash of an identifier (upstream ``_hash_id``)."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]


def hash_sender_id(value: str) -> str:
    """Hash a sender ID to ``user_<12hex>`` (upstream ``_hash_sender_id``)."""
    return f"user_{hash_id(value)}"


def hash_chat_id(value: str) -> str:
    """Hash what follows a ``platform:`` prefix, keeping it (upstream ``_hash_chat_id``)."""
    prefix, sep, rest = value.partition(":")
    return f"{prefix}:{hash_id(rest)}" if sep and prefix else hash_id(value)


def _require_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes | bytearray) or len(secret) < MIN_SECRET_BYTES:
        raise InvalidInput(f"the hashing secret must be at least {MIN_SECRET_BYTES} bytes")
    return bytes(secret)


def keyed_hash_id(secret: bytes, value: str, length: int = KEYED_HASH_HEX) -> str:
    """HMAC-SHA256 of ``value`` under ``secret``, as hex: stable, not reversible by enumeration."""
    digest = hmac.new(_require_secret(secret), value.encode("utf-8"), hashlib.sha256)
    return digest.hexdigest()[:length]


def keyed_hash_sender_id(secret: bytes, value: str) -> str:
    return f"user_{keyed_hash_id(secret, value)}"


def keyed_hash_chat_id(secret: bytes, value: str) -> str:
    prefix, sep, rest = value.partition(":")
    if sep and prefix:
        return f"{prefix}:{keyed_hash_id(secret, rest)}"
    return keyed_hash_id(secret, value)


@attrs.frozen
class KeyedHasher:
    """A ``hasher`` for ``build_session_key``: HMAC under one installation's secret."""

    secret: bytes = attrs.field(repr=False, converter=_require_secret)

    def __call__(self, value: str) -> str:
        return keyed_hash_id(self.secret, value)

    @property
    def fingerprint(self) -> str:
        """Identifies the secret without revealing it (stored, to detect a swapped secret)."""
        return keyed_hash_id(self.secret, FINGERPRINT_LABEL, 32)
