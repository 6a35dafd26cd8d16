"""The WhatsApp bridge's LID <-> phone mapping files, as the alias table of session keys.

The Node bridge writes ``lid-mapping-<phone>.json`` (holding the LID) and
``lid-mapping-<lid>_reverse.json`` (holding the phone) in its session directory; upstream
reads both when it makes a WhatsApp id canonical, and so does this reader. A file that is
missing, unreadable or not a JSON string or number gives nothing: an id then keys by its
own form, as upstream's does.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("gateway_ledger.sessions")


def whatsapp_session_dir(home: str | Path) -> Path:
    """Upstream's choice: ``<home>/whatsapp/session`` if it exists and is not empty, else
    ``<home>/platforms/whatsapp/session``."""
    legacy = Path(home) / "whatsapp" / "session"
    if legacy.is_dir() and any(legacy.iterdir()):
        return legacy
    return Path(home) / "platforms" / "whatsapp" / "session"


class BridgeAliasFiles:
    """``AliasLookup`` over one bridge session directory (read at each lookup: the bridge
    adds mappings while the gateway runs)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def __call__(self, identifier: str) -> list[str]:
        found: list[str] = []
        for name in (f"lid-mapping-{identifier}.json", f"lid-mapping-{identifier}_reverse.json"):
            path = self.directory / name
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as e:
                log.warning("WhatsApp mapping file %s unreadable: %s", name, type(e).__name__)
                continue
            if isinstance(value, str | int) and not isinstance(value, bool):
                found.append(str(value))
        return found
