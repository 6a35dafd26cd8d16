"""SessionSource: where a message came from (platform, chat, sender, thread).

Upstream's field set. ``chat_id`` is always a string (platforms hand out numbers, but they
are keys). Internal trust flags (``delivered_via_upstream_relay``, ``role_authorized``) are
set by the adapter for the current message only: they are excluded from equality, never
written by ``to_dict`` and ignored by ``from_dict``, so stored data cannot forge them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import require_clear_text, require_text

CHAT_TYPES = ("dm", "group", "channel", "thread")
"""The chat types upstream names; adapters also send others (Telegram ``forum`` for a
supergroup topic, ``webhook``), which are accepted and keyed like a group."""
LOCAL_PLATFORM = "local"

_OPTIONAL_TEXT = (
    "chat_name",
    "user_id",
    "user_name",
    "thread_id",
    "chat_topic",
    "user_id_alt",
    "chat_id_alt",
    "scope_id",
    "parent_chat_id",
    "message_id",
    "profile",
)
_ALWAYS = ("chat_id", "chat_name", "chat_type", "user_id", "user_name", "thread_id", "chat_topic")
_TRUTHY_ONLY = ("user_id_alt", "chat_id_alt", "scope_id", "parent_chat_id", "message_id", "profile")
TRUST_FLAGS = ("delivered_via_upstream_relay", "role_authorized")
PERSONAL_FIELDS = ("chat_id", *(name for name in _OPTIONAL_TEXT if name != "profile"))
"""Who and where: the fields that identify a person or a chat (platform, chat_type, is_bot
and profile do not)."""


def _as_id(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def _optional(value: object) -> str | None:
    """Ids may arrive as ints; empty means absent, so ``""`` and ``None`` are one value."""
    value = _as_id(value)
    if value is None or value == "":
        return None
    return value  # type: ignore[return-value]  # checked in __attrs_post_init__


def _chat_id(value: object) -> str:
    value = _as_id(value)
    return "" if value is None else value  # type: ignore[return-value]


@attrs.frozen
class SessionSource:
    """Where a message originated; decides its session key and where replies go."""

    platform: str
    chat_id: str = attrs.field(default="", converter=_chat_id)
    chat_name: str | None = attrs.field(default=None, converter=_optional)
    chat_type: str = "dm"
    user_id: str | None = attrs.field(default=None, converter=_optional)
    user_name: str | None = attrs.field(default=None, converter=_optional)
    thread_id: str | None = attrs.field(default=None, converter=_optional)
    chat_topic: str | None = attrs.field(default=None, converter=_optional)
    user_id_alt: str | None = attrs.field(default=None, converter=_optional)
    chat_id_alt: str | None = attrs.field(default=None, converter=_optional)
    is_bot: bool = False
    scope_id: str | None = attrs.field(default=None, converter=_optional)
    parent_chat_id: str | None = attrs.field(default=None, converter=_optional)
    message_id: str | None = attrs.field(default=None, converter=_optional)
    profile: str | None = attrs.field(default=None, converter=_optional)
    # Trust flags: for this message only; never stored, never restored, not part of equality.
    delivered_via_upstream_relay: bool = attrs.field(default=False, eq=False, repr=False)
    role_authorized: bool = attrs.field(default=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        require_clear_text("platform", self.platform)
        if self.platform != self.platform.strip():
            raise InvalidInput("platform must not have surrounding whitespace")
        require_clear_text("chat_type", self.chat_type)
        if not self.chat_type or self.chat_type != self.chat_type.strip():
            raise InvalidInput(
                f"chat_type {self.chat_type!r} must be non-empty, without surrounding "
                f"whitespace (upstream's are {', '.join(CHAT_TYPES)}; others key like a group)"
            )
        require_text("chat_id", self.chat_id, allow_empty=True)
        for name in _OPTIONAL_TEXT:
            value = getattr(self, name)
            if value is not None:
                require_text(name, value, allow_empty=True)
        if self.profile is not None:  # not personal: kept in clear
            require_clear_text("profile", self.profile, allow_empty=True)
        for name in ("is_bot", *TRUST_FLAGS):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInput(f"{name} must be a bool")

    @property
    def is_dm(self) -> bool:
        return self.chat_type == "dm"

    @property
    def description(self) -> str:
        """Readable origin for the agent's context: "DM with alice", "group: Ops, thread: 42"."""
        if self.platform == LOCAL_PLATFORM:
            return "CLI terminal"
        if self.chat_type == "dm":
            text = f"DM with {self.user_name or self.user_id or 'user'}"
        else:
            prefix = {"group": "group: ", "channel": "channel: "}.get(self.chat_type, "")
            text = f"{prefix}{self.chat_name or self.chat_id}"
        return f"{text}, thread: {self.thread_id}" if self.thread_id else text

    def to_dict(self) -> dict[str, Any]:
        """Upstream's wire layout; trust flags are never written."""
        data: dict[str, Any] = {"platform": self.platform}
        data.update((name, getattr(self, name)) for name in _ALWAYS)
        data.update((name, v) for name in _TRUTHY_ONLY if (v := getattr(self, name)))
        if self.is_bot:
            data["is_bot"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionSource:
        """Inverse of ``to_dict``; unknown keys and trust flags in ``data`` are ignored."""
        if not isinstance(data, Mapping):
            raise InvalidInput("a stored SessionSource must be a mapping")
        if "platform" not in data:
            raise InvalidInput("a stored SessionSource needs a platform")
        kwargs: dict[str, Any] = {
            name: data.get(name) for name in _OPTIONAL_TEXT if data.get(name) is not None
        }
        if kwargs.get("scope_id") is None and data.get("guild_id") is not None:
            kwargs["scope_id"] = data["guild_id"]  # upstream's deprecated alias
        return cls(
            platform=data["platform"],
            chat_id=data.get("chat_id", ""),
            chat_type=data.get("chat_type") or "dm",
            is_bot=bool(data.get("is_bot", False)),
            **kwargs,
        )
