"""The installation master key: the root of the key hierarchy (ADR 0012).

It never touches the event store. It comes from ``GATEWAY_LEDGER_MASTER_KEY`` (32 bytes,
base64), or from a key file created on first open with owner-only permissions (0600):
next to an SQLite store (``<db>.key``), or in ``GATEWAY_LEDGER_KEY_DIR`` (default
``~/.local/share/gateway-ledger``) for PostgreSQL. Purpose keys are derived from it with
HKDF, so one secret wraps data keys and names subjects without the two uses mixing.
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

from gateway_ledger.domain.errors import InvalidInput

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


def _decode(text: str, source: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"the master key in {source} is not base64") from None
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


def load_master_key(location: str, key_file: str | Path | None = None) -> bytes:
    """The master key from the environment, else from the key file (created if absent)."""
    text = os.environ.get(MASTER_KEY_ENV)
    if text:
        return _decode(text, f"${MASTER_KEY_ENV}")
    path = Path(key_file) if key_file else default_key_file(location)
    if not path.exists():
        _create_key_file(path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("master key file %s is readable by others (mode %o); chmod 600 it", path, mode)
    return _decode(path.read_text(), str(path))


def _create_key_file(path: Path) -> None:
    """Write a fresh key to a private temporary file, then link it into place.

    ``os.link`` fails if another process created the file first; that process's key
    wins and both read the same one. A reader never sees a half-written key.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            log.info("created master key file %s (mode 600)", path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
