"""The installation id: one per gateway installation, stable across restarts.

An :class:`OwnerIdentity` names a process (host, boot, pid, start time); the installation
id says which deployment it belongs to, so history and leases stay readable when several
gateways share one PostgreSQL store. Resolution order:

1. ``GATEWAY_LEDGER_INSTALLATION_ID`` (configured, or a test posing as another host);
2. a file holding a generated id: ``GATEWAY_LEDGER_INSTALLATION_FILE`` if set, else next to
   an SQLite store (``<db>.installation-id``), else
   ``$XDG_STATE_HOME/gateway-ledger/installation-id`` (``~/.local/state/...``);
3. generated once (uuid4) and linked into place atomically, so concurrent first starts
   agree on one id.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("gateway_ledger.installation")

INSTALLATION_ENV = "GATEWAY_LEDGER_INSTALLATION_ID"
INSTALLATION_FILE_ENV = "GATEWAY_LEDGER_INSTALLATION_FILE"
HOST_ENV = "GATEWAY_LEDGER_HOST"


def installation_file(sqlite_path: str | None, env: Mapping[str, str] = os.environ) -> Path:
    configured = env.get(INSTALLATION_FILE_ENV)
    if configured:
        return Path(configured)
    if sqlite_path:
        return Path(f"{sqlite_path}.installation-id")
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "gateway-ledger" / "installation-id"


def resolve_installation_id(
    sqlite_path: str | None = None, env: Mapping[str, str] = os.environ, *, persist: bool = True
) -> str:
    """The configured id, else the persisted one, else a new one persisted now.

    Never fails: when the file cannot be written the id is still returned (and logged),
    it just will not survive a restart. ``persist=False`` (a store opened read-only)
    writes nothing: a process that appends no event needs no lasting id.
    """
    configured = env.get(INSTALLATION_ENV, "").strip()
    if configured:
        return configured
    path = installation_file(sqlite_path, env)
    try:
        text = path.read_text().strip()
        if text:
            return text
    except OSError:
        pass
    new_id = uuid.uuid4().hex
    if not persist:
        return new_id
    temp = path.with_name(f".{path.name}.{os.getpid()}.{new_id[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(new_id + "\n")
        os.link(temp, path)  # atomic, and refuses to replace: the first start wins
    except FileExistsError:
        return path.read_text().strip() or new_id
    except OSError as e:
        log.warning("installation id %s not persisted (%s)", new_id, type(e).__name__)
        return new_id
    finally:
        temp.unlink(missing_ok=True)
    log.info("installation id %s created in %s", new_id, path)
    return new_id


def configured_host(env: Mapping[str, str] = os.environ) -> str | None:
    """``GATEWAY_LEDGER_HOST`` when set (containers sharing a name, tests posing as hosts)."""
    return env.get(HOST_ENV, "").strip() or None
