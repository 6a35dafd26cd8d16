"""The installation master key: the root of the key hierarchy (ADR 0012).

It never touches the event store. It comes from ``GATEWAY_LEDGER_MASTER_KEY`` (32 bytes,
base64), or from a key file created on first use with owner-only permissions (0600):
next to an SQLite store (``<db>.key``), or in ``GATEWAY_LEDGER_KEY_DIR`` (default
``~/.local/share/gateway-ledger``) for PostgreSQL. Purpose keys are derived from it with
HKDF, so one secret wraps data keys and names subjects without the two uses mixing.

A key file is created only for a store that holds nothing sealed yet, and adopted only if
this user owns it and nobody else can read it (``private_files``): a key planted by
another local user would let them read everything sealed after.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway_ledger.domain.errors import InvalidInput, MasterKeyMissing
from gateway_ledger.infrastructure.privacy.private_files import (
    read_or_create_private_file,
    read_private_file,
)

log = logging.getLogger("gateway_ledger.privacy")

MASTER_KEY_ENV = "GATEWAY_LEDGER_MASTER_KEY"
KEY_FILE_ENV = "GATEWAY_LEDGER_KEY_FILE"
KEY_DIR_ENV = "GATEWAY_LEDGER_KEY_DIR"
KEY_BYTES = 32


def derive(master: bytes, purpose: str) -> bytes:
    """A 32-byte key for one purpose; different purposes never share key material."""
    return HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_BYTES,
        salt=b"gateway-ledger",
        info=purpose.encode(),
    ).derive(master)


def _decode(data: bytes | str, source: str) -> bytes:
    try:
        text = data.decode("ascii") if isinstance(data, bytes) else data
        raw = base64.b64decode(text.strip(), validate=True)
    except (UnicodeDecodeError, binascii.Error, ValueError):
        raise InvalidInput(f"the master key in {source} is not base64 text") from None
    if len(raw) != KEY_BYTES:
        raise InvalidInput(f"the master key in {source} must be {KEY_BYTES} bytes, not {len(raw)}")
    return raw


def default_key_file(location: str) -> Path:
    """``<db>.key`` beside an SQLite store; a per-user directory for PostgreSQL."""
    configured = os.environ.get(KEY_FILE_ENV)
    if configured:
        return Path(configured)
    if location and not location.startswith(("postgresql://", "postgres://")):
        return Path(location + ".key")
    directory = os.environ.get(KEY_DIR_ENV) or str(
        Path.home() / ".local" / "share" / "gateway-ledger"
    )
    return Path(directory) / "master.key"


def read_master_key(location: str, key_file: str | Path | None = None) -> bytes | None:
    """The configured master key, or None when neither the variable nor the file exists.

    A key file is used only if this user owns it and nobody else can read it
    (:func:`read_private_file`); a malformed one is an ``InvalidInput``, never a new key.
    """
    text = os.environ.get(MASTER_KEY_ENV)
    if text:
        return _decode(text, f"${MASTER_KEY_ENV}")
    path = Path(key_file) if key_file else default_key_file(location)
    data = read_private_file(path, "master key file")
    return None if data is None else _decode(data, str(path))


def load_master_key(
    location: str, key_file: str | Path | None = None, *, create: bool = False
) -> bytes:
    """The master key; with ``create=True`` a new key file is made when there is none.

    Only a store that holds nothing sealed yet may get a new key (``KeyRing`` decides):
    a fresh key beside sealed data could open none of it.
    """
    master = read_master_key(location, key_file)
    if master is not None:
        return master
    path = Path(key_file) if key_file else default_key_file(location)
    if not create:
        raise MasterKeyMissing(
            f"master key missing: no {path} and no ${MASTER_KEY_ENV}; restore the key "
            "this store was sealed with (a new key could not open its data)"
        )

    def new_key() -> bytes:
        log.info("creating master key file %s (mode 600)", path)
        return base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n"

    return _decode(read_or_create_private_file(path, "master key file", new_key), str(path))
