"""Drop-in for upstream's ``gateway/delivery_ledger.py``: its module-level functions, names,
keyword arguments, return shapes and defaults, backed by gateway-ledger.

An existing gateway switches by changing its import::

    from gateway import delivery_ledger            # before
    from gateway_ledger import delivery_ledger     # after

Configured like upstream, from the environment and the home directory: the store is
``$GATEWAY_LEDGER_DB`` if set, else ``gateway-ledger.db`` in ``$HERMES_HOME`` (``~/.hermes``
when unset), resolved again on every call as upstream resolves its ``state.db``. Or by one
call: ``configure("/var/lib/gateway/ledger.db")`` (a file or a ``postgresql://`` URL).

Where upstream's behaviour is a known bug, this module keeps gateway-ledger's (README,
"Migrating from an existing gateway"): recording an id again never rewinds it; nothing
unresolved is pruned; an owner is alive by pid *and* start time (and by lease on
PostgreSQL); ``mark_*`` refuses an illegal transition instead of writing it, and says so
in the log. As upstream, ``mark_*`` of an unknown id is a silent no-op and a store error
of ``record_obligation`` propagates (its callers wrap every call).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway_ledger import bootstrap
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.domain.errors import IllegalTransition, NotFound

__all__ = [
    "MAX_ATTEMPTS",
    "RECOVERED_MARKER",
    "STALE_AFTER_SECONDS",
    "close",
    "compute_obligation_id",
    "configure",
    "debug_rows",
    "ledger_enabled",
    "mark_attempting",
    "mark_delivered",
    "mark_failed",
    "record_obligation",
    "sweep_recoverable",
]

log = logging.getLogger("gateway_ledger.delivery_ledger")

MAX_ATTEMPTS = 3
STALE_AFTER_SECONDS = 86400
RECOVERED_MARKER = (
    "♻️ Recovered reply — the gateway restarted during delivery, so this may be a duplicate:\n\n"
)
DB_ENV = "GATEWAY_LEDGER_DB"
DB_FILE = "gateway-ledger.db"
SWEEP_KEYS = (
    "obligation_id",
    "session_key",
    "platform",
    "chat_id",
    "thread_id",
    "content",
    "needs_marker",
    "attempts",
)
"""The keys of each dict ``sweep_recoverable`` returns, as upstream's."""

_lock = threading.Lock()
_configured: str | None = None
_ledger: bootstrap.DeliveryLedger | None = None
_opened_at: str | None = None


def hermes_home() -> Path:
    """``$HERMES_HOME`` (stripped, non-empty), else ``~/.hermes`` (``%LOCALAPPDATA%\\hermes``
    on Windows), as upstream resolves it."""
    home = os.environ.get("HERMES_HOME", "").strip()
    if home:
        return Path(home).expanduser()
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "hermes"
    return Path.home() / ".hermes"


def store_location() -> str:
    """Where the ledger is now: ``configure``'s location, else ``$GATEWAY_LEDGER_DB``, else
    ``$HERMES_HOME/gateway-ledger.db``."""
    if _configured is not None:
        return _configured
    return os.environ.get(DB_ENV, "").strip() or str(hermes_home() / DB_FILE)


def configure(location: str | Path | None = None) -> None:
    """Use the store at ``location`` from now on (None: back to the environment). The ledger
    is opened at the next call."""
    global _configured
    with _lock:
        _configured = None if location is None else str(location)
        _close_locked()


def close() -> None:
    """Close the ledger (releasing its lease); the next call opens it again."""
    with _lock:
        _close_locked()


def _close_locked() -> None:
    global _ledger, _opened_at
    ledger, _ledger, _opened_at = _ledger, None, None
    if ledger is not None:
        ledger.close()


def _ledger_now() -> bootstrap.DeliveryLedger:
    """The ledger at the current location, opened (and the one before closed) as needed."""
    global _ledger, _opened_at
    location = store_location()
    if _ledger is None or _opened_at != location:
        _close_locked()
        if "://" not in location:
            Path(location).parent.mkdir(parents=True, exist_ok=True)
        _ledger = bootstrap.DeliveryLedger.open(location)
        _opened_at = location
    return _ledger


def record_obligation(
    *,
    obligation_id: str,
    session_key: str,
    platform: str,
    chat_id: str,
    thread_id: str | None,
    content: str,
) -> None:
    """Record a final reply as owed (pending, owned by this process). Recording the same id
    again changes nothing (upstream rewound a delivered row to pending)."""
    with _lock:
        _ledger_now().record_obligation(
            obligation_id=obligation_id,
            session_key=session_key,
            platform=str(platform),
            chat_id=str(chat_id),
            thread_id=str(thread_id) if thread_id else None,
            content=content,
        )


def _mark(obligation_id: str, transition: str, *args: Any) -> None:
    with _lock:
        ledger = _ledger_now()
        try:
            getattr(ledger, f"mark_{transition}")(obligation_id, *args)
        except NotFound:
            return  # upstream: an UPDATE of no row
        except IllegalTransition as e:
            log.warning("delivery ledger: %s refused: %s", transition, e)


def mark_attempting(obligation_id: str) -> None:
    _mark(obligation_id, "attempting")


def mark_delivered(obligation_id: str) -> None:
    _mark(obligation_id, "delivered")


def mark_failed(obligation_id: str, error: str = "") -> None:
    _mark(obligation_id, "failed", str(error or ""))


def sweep_recoverable(
    now: float | None = None, *, deliverable_platforms: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Claim what dead owners left unresolved, as upstream's dicts: ``obligation_id``,
    ``session_key``, ``platform``, ``chat_id``, ``content`` (str), ``thread_id`` (str or
    None), ``needs_marker`` (bool: send ``RECOVERED_MARKER`` + content) and ``attempts``
    (int, after this claim). Stale and exhausted ones are abandoned on the way."""
    moment = None if now is None else datetime.fromtimestamp(float(now), UTC)
    platforms = None if deliverable_platforms is None else {str(p) for p in deliverable_platforms}
    with _lock:
        won = _ledger_now().sweep_recoverable(moment, deliverable_platforms=platforms)
    return [{name: item[name] for name in SWEEP_KEYS} for item in won]


def debug_rows(limit: int = 20) -> str:
    """The newest ``limit`` obligations as a JSON array (indent 2), newest change first,
    each with upstream's keys: ``id``, ``session``, ``state``, ``attempts``,
    ``created_at``, ``updated_at`` (epoch seconds) and ``last_error``."""
    with _lock:
        ledger = _ledger_now()
        newest = sorted(ledger.list(), key=lambda e: e.last_transition_at, reverse=True)
        rows = []
        for entry in newest[: max(int(limit), 0)]:
            status = ledger.get(entry.obligation_id)
            rows.append(
                {
                    "id": status.obligation_id,
                    "session": status.session_key,
                    "state": status.state,
                    "attempts": status.recovery_attempts,
                    "created_at": status.recorded_at.timestamp(),
                    "updated_at": status.last_transition_at.timestamp(),
                    "last_error": status.last_error or None,
                }
            )
    return json.dumps(rows, indent=2)


_FALSE = frozenset({"false", "0", "no", "off"})


def ledger_enabled(config: Mapping[str, Any] | None = None) -> bool:
    """``gateway.delivery_ledger`` of ``config`` (default: ``$HERMES_HOME/config.yaml``):
    true unless it says ``false``/``0``/``no``/``off`` or is falsy; true on any error."""
    try:
        value = (config if config is not None else _config_yaml()).get("gateway", {})
        flag = value.get("delivery_ledger", True)
        if isinstance(flag, str):
            return flag.strip().lower() not in _FALSE
        return bool(flag)
    except Exception:  # upstream: any error means enabled
        return True


def _config_yaml() -> Mapping[str, Any]:
    """``config.yaml``'s ``gateway.delivery_ledger``: with PyYAML when installed, else read
    by its two lines (the one value this module needs)."""
    text = (hermes_home() / "config.yaml").read_text(encoding="utf-8")
    try:
        import yaml
    except ImportError:
        section: dict[str, Any] = {}
        inside = False
        for line in text.splitlines():
            if line and not line[0].isspace():
                inside = line.split("#")[0].strip() == "gateway:"
            elif inside and line.strip().startswith("delivery_ledger:"):
                section["delivery_ledger"] = line.split(":", 1)[1].split("#")[0].strip()
        return {"gateway": section}
    loaded = yaml.safe_load(text) or {}
    return loaded if isinstance(loaded, Mapping) else {}
