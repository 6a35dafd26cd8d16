"""The per-installation secret behind keyed session-key hashing.

Created on first use with owner-only permissions (0600) and never rewritten: losing or
replacing it changes every hashed key, i.e. starts a new session for every conversation
(the store detects that, see ``SessionKeying``). For SQLite it lives next to the database
file; for PostgreSQL every host must read the same secret, so a directory must be given
(``secret_dir=`` or ``GATEWAY_LEDGER_SECRET_DIR``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.infrastructure.eventstore.store import is_postgres_url
from gateway_ledger.infrastructure.privacy.private_files import read_or_create_private_file

SECRET_BYTES = 32
SECRET_DIR_ENV = "GATEWAY_LEDGER_SECRET_DIR"


def secret_path(location: str | Path, secret_dir: str | Path | None = None) -> Path:
    """Where the session secret of the store at ``location`` lives."""
    text = str(location)
    directory = secret_dir or os.environ.get(SECRET_DIR_ENV)
    if is_postgres_url(text):
        if not directory:
            raise InvalidInput(
                "a PostgreSQL session store needs secret_dir= (or "
                f"{SECRET_DIR_ENV}): every host must hash keys with the same secret"
            )
        from gateway_ledger.infrastructure.eventstore.postgres import parse_postgres_url

        params = parse_postgres_url(text)
        return Path(directory) / f"{params['dbname']}.{params['schema']}.session-secret"
    db = Path(text)
    if directory:
        return Path(directory) / f"{db.name}.session-secret"
    return db.with_name(f"{db.name}.session-secret")


def load_or_create_secret(path: str | Path) -> bytes:
    """Read the secret at ``path``, creating it atomically (0600) if it does not exist.

    An existing secret is adopted only if this user owns it and nobody else can read it
    (the same rule as the master key's, in ``private_files``).
    """
    target = Path(path)
    data = read_or_create_private_file(
        target,
        "session secret",
        lambda: (secrets.token_hex(SECRET_BYTES) + "\n").encode("ascii"),
    )
    try:
        secret = bytes.fromhex(data.decode("ascii").strip())
    except ValueError:  # UnicodeDecodeError included
        raise InvalidInput(f"{target} does not hold a hex secret") from None
    if len(secret) < 16:
        raise InvalidInput(f"{target} holds a secret shorter than 16 bytes")
    return secret
