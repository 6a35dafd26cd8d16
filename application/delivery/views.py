"""What the ledger hands back to callers: plain, frozen snapshots, never live aggregates."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs

from gateway_ledger.application.observability import causes
from gateway_ledger.application.observability.causes import META
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import MediaItem, OwnerIdentity


def plain(value: Any) -> Any:
    """Attrs values and containers as JSON-ready builtins (for history and the CLI)."""
    if attrs.has(type(value)):
        return {k: plain(v) for k, v in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):
        return value.value
    return value


@attrs.frozen
class ObligationStatus:
    """The current state of one obligation, as derived from its events."""

    obligation_id: str
    state: str
    session_key: str
    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    content: str
    parts: tuple[str, ...]
    media: tuple[MediaItem, ...]
    metadata: dict[str, Any]
    owner: OwnerIdentity
    recovery_attempts: int
    send_attempts: int
    fence: int
    needs_marker: bool
    last_error: str
    error_class: str | None
    retry_after: float | None
    receipt: tuple[str, ...]
    abandon_reason: str | None
    recorded_at: datetime
    last_transition_at: datetime
    version: int
    quarantine_reason: str | None = None
    """Set when a reader found it unreadable: never sent again, only abandoned (ADR 0027)."""
    platform_status: str | None = None
    """The last status its platform reported after accepting it (ADR 0050)."""

    @classmethod
    def of(cls, agg: DeliveryObligation) -> ObligationStatus:
        return cls(
            obligation_id=agg.obligation_id,
            state=agg.state.value,
            session_key=agg.session_key,
            platform=agg.target.platform,
            chat_id=agg.target.chat_id,
            thread_id=agg.target.thread_id,
            reply_to=agg.target.reply_to,
            content=agg.content,
            parts=tuple(agg.parts),
            media=tuple(agg.media),
            metadata=dict(agg.metadata),
            owner=agg.owner,
            recovery_attempts=agg.recovery_attempts,
            send_attempts=agg.send_attempts,
            fence=agg.fence,
            needs_marker=agg.needs_marker,
            last_error=agg.last_error,
            error_class=agg.error_class.value if agg.error_class else None,
            retry_after=agg.retry_after,
            receipt=tuple(agg.receipt),
            abandon_reason=agg.abandon_reason.value if agg.abandon_reason else None,
            recorded_at=agg.recorded_at,
            last_transition_at=agg.last_transition_at,
            version=agg.version,
            quarantine_reason=agg.quarantine_reason.value if agg.quarantine_reason else None,
            platform_status=agg.platform_status.value if agg.platform_status else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: plain(v) for k, v in attrs.asdict(self, recurse=False).items()}


_ENVELOPE = {"originator_id", "originator_version", "timestamp", "originator_topic"}


@attrs.frozen
class HistoryEntry:
    """One event of an obligation's history: what happened, when, and with which facts."""

    version: int
    type: str
    timestamp: datetime
    fields: dict[str, Any]
    meta: dict[str, str] = attrs.field(factory=dict)
    """What caused it: ``correlation_id``, ``causation_id``, ``trace_id`` (ADR 0058); empty
    for an event written before events recorded them."""

    @classmethod
    def of(cls, domain_event: Any) -> HistoryEntry:
        data = {k: v for k, v in domain_event.__dict__.items() if k not in _ENVELOPE and k != META}
        return cls(
            version=domain_event.originator_version,
            type=type(domain_event).__name__,
            timestamp=domain_event.timestamp,
            fields=data,
            meta=causes.of(domain_event),
        )

    def to_dict(self) -> dict[str, Any]:
        data = {
            "version": self.version,
            "type": self.type,
            "timestamp": self.timestamp.isoformat(),
            "fields": plain(self.fields),
        }
        if self.meta:  # an event written before events recorded causes has none
            data["meta"] = dict(self.meta)
        return data
