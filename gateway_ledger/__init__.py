"""gateway-ledger: the session and delivery layer of a chat-agent gateway.

The names below are the public API; each is imported on first use, so
``import gateway_ledger`` stays cheap and the layers can import each other freely.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # delivery
    "DeliveryLedger": "gateway_ledger.bootstrap",
    "compute_obligation_id": "gateway_ledger.domain.delivery.obligation",
    "ObligationStatus": "gateway_ledger.application.delivery.views",
    "HistoryEntry": "gateway_ledger.application.delivery.views",
    "ErrorClass": "gateway_ledger.domain.values",
    "AbandonReason": "gateway_ledger.domain.values",
    "MediaItem": "gateway_ledger.domain.values",
    "LedgerPolicy": "gateway_ledger.domain.values",
    "OwnerIdentity": "gateway_ledger.domain.values",
    # the gateway's delivery path
    "Gateway": "gateway_ledger.bootstrap",
    "PlatformAdapter": "gateway_ledger.application.delivery.ports",
    "AdapterBase": "gateway_ledger.application.delivery.ports",
    "SendResult": "gateway_ledger.application.delivery.ports",
    "ReconcileAnswer": "gateway_ledger.application.delivery.reconciliation",
    "ReconcileQuery": "gateway_ledger.application.delivery.reconciliation",
    "Reply": "gateway_ledger.application.delivery.ports",
    "ReplyContext": "gateway_ledger.application.delivery.ports",
    # operating
    "ViewFollower": "gateway_ledger.infrastructure.views.follower",
    "LedgerCollector": "gateway_ledger.infrastructure.observability.prometheus",
    "turn": "gateway_ledger.application.observability.causes",
    # sessions
    "SessionStore": "gateway_ledger.bootstrap",
    "SessionSource": "gateway_ledger.domain.sessions.source",
    "build_session_key": "gateway_ledger.domain.sessions.key",
    "is_path_unsafe": "gateway_ledger.domain.sessions.key",
    "is_session_key_unsafe": "gateway_ledger.domain.sessions.key",
    "hash_id": "gateway_ledger.domain.privacy.hashing",
    "hash_sender_id": "gateway_ledger.domain.privacy.hashing",
    "hash_chat_id": "gateway_ledger.domain.privacy.hashing",
    # migrating from an existing gateway (see also gateway_ledger.delivery_ledger)
    "import_hermes": "gateway_ledger.entrypoints.hermes_import",
    # errors
    "LedgerError": "gateway_ledger.domain.errors",
    "InvalidInput": "gateway_ledger.domain.errors",
    "IllegalTransition": "gateway_ledger.domain.errors",
    "NotFound": "gateway_ledger.domain.errors",
    "ConcurrentUpdate": "gateway_ledger.domain.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'gateway_ledger' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
