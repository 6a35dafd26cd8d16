"""What the delivery path needs from a chat platform, and what it hands to one.

A gateway author implements :class:`PlatformAdapter` once per platform (usually by
wrapping the client it already has); everything else in the delivery path is ours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from gateway_ledger.application.delivery.rate_limits import RateLimits
from gateway_ledger.domain.values import DeliveryTarget, ErrorClass, MediaItem

DUPLICATE_NOTICE = (
    "♻️ Recovered reply — the gateway restarted during delivery, so this may be a duplicate:"
)
"""Upstream's prefix for a re-send whose earlier send may have reached the user."""


def default_duplicate_notice(content: str) -> str:
    return f"{DUPLICATE_NOTICE}\n{content}" if content else DUPLICATE_NOTICE


def _str_tuple(values: Any) -> tuple[str, ...]:
    return tuple(map(str, values))


def _any_tuple(values: Any) -> tuple[Any, ...]:
    return tuple(values)


@attrs.frozen
class SendResult:
    """What one send achieved. ``error_class`` is required when ``success`` is false."""

    success: bool
    message_ids: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    error: str = ""
    retry_after: float | None = None
    error_class: ErrorClass | None = attrs.field(
        default=None, converter=attrs.converters.optional(ErrorClass)
    )
    retry_scope: str = attrs.field(default="chat", validator=attrs.validators.in_(("chat", "bot")))
    """What a ``retry_after`` pauses: the chat it was sent to, or the whole bot (every
    chat of the platform) when the platform says the account's budget is spent."""

    @classmethod
    def ok(cls, *message_ids: str) -> SendResult:
        return cls(success=True, message_ids=message_ids)

    @classmethod
    def failed(
        cls,
        error_class: ErrorClass | str,
        error: str = "",
        retry_after: float | None = None,
        retry_scope: str = "chat",
    ) -> SendResult:
        return cls(
            success=False,
            error=error,
            retry_after=retry_after,
            error_class=ErrorClass(error_class),
            retry_scope=retry_scope,
        )


@runtime_checkable
class PlatformAdapter(Protocol):
    """One connected chat platform, as the delivery path sees it.

    ``send`` must not raise for platform errors it can classify; it returns a failed
    :class:`SendResult` instead. Anything it raises is treated as *ambiguous* (the request
    may have reached the platform), so the next send of that reply carries the marker.

    An adapter may also declare ``rate_limits`` (a ``RateLimits``; ``rate_limits.py`` has
    presets): every send through it, live, retried or recovered, is then paced by them
    (ADR 0065). None declared: nothing is paced.
    """

    platform: str
    supports_idempotency: bool
    """True when the platform deduplicates on ``idempotency_key`` (Google Chat requestId,
    Discord nonce with enforce_nonce, LINE X-Line-Retry-Key): re-sends then carry no marker."""

    async def send(
        self,
        target: DeliveryTarget,
        content: str,
        *,
        reply_to: str | None,
        media: Sequence[MediaItem],
        metadata: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> SendResult: ...


class AdapterBase:
    """Optional base class with the defaults: no native idempotency, upstream notice text."""

    platform: str = ""
    supports_idempotency: bool = False
    rate_limits: RateLimits | None = None

    def render_duplicate_notice(self, content: str) -> str:
        return default_duplicate_notice(content)

    async def connect(self) -> None:
        """Called by ``Gateway.start``; a platform whose connect raises is not swept."""


def render_duplicate_notice(adapter: PlatformAdapter, content: str) -> str:
    """The adapter's own rendering when it has one, else the upstream prefix."""
    render = getattr(adapter, "render_duplicate_notice", None)
    if render is None:
        return default_duplicate_notice(content)
    return str(render(content))


@attrs.frozen
class ReplyContext:
    """Where a reply goes and what it answers: built from the session the turn ran in.

    ``inbound_text`` is the user's message; a reply to a command (``/status``, ``!status``)
    skips the ledger, like upstream.
    """

    session_key: str
    platform: str
    chat_id: str = attrs.field(converter=str)
    thread_id: str | None = None
    inbound_text: str | None = None

    @classmethod
    def from_session(cls, session: Any, inbound_text: str | None = None) -> ReplyContext:
        """Adapt a ``SessionContext`` (anything with ``key``/``session_key`` and ``source``)."""
        key = getattr(session, "session_key", None) or session.key
        source = session.source
        return cls(
            session_key=key,
            platform=source.platform,
            chat_id=source.chat_id,
            thread_id=getattr(source, "thread_id", None),
            inbound_text=inbound_text,
        )


@attrs.frozen
class Reply:
    """The agent's final reply: text (optionally pre-split in chunks) then media."""

    content: str
    parts: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    media: tuple[MediaItem, ...] = attrs.field(default=(), converter=_any_tuple)
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    ephemeral: bool = False

    @classmethod
    def chunked(cls, content: str, limit: int, **kwargs: Any) -> Reply:
        """Split ``content`` in chunks of at most ``limit`` characters (platform max length)."""
        if limit <= 0:
            raise ValueError("limit must be positive")
        chunks = tuple(content[i : i + limit] for i in range(0, len(content), limit))
        return cls(content=content, parts=chunks if len(chunks) > 1 else (), **kwargs)
