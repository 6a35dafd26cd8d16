"""What a platform allows: the rate limits an adapter declares (ADR 0065).

An adapter declares them as ``rate_limits`` (a :class:`RateLimits`); the pacer
(``pacing.py``) applies them to every send of the gateway, live, retried or recovered.
A limit is "at most ``sends`` in any window of ``per`` seconds", the strictest reading of
what platforms document, so a burst never exceeds it anywhere in time.

The presets follow the platforms' published guidance as of 2026 (they change; an adapter
should override them with what its platform answers): Telegram about 30 messages a second
per bot, one a second per chat, 20 a minute per group; Discord 5 per 5 seconds per
channel and 50 requests a second per bot; Slack ``chat.postMessage`` one a second per
channel; WhatsApp Cloud API 80 messages a second per business number.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import DeliveryTarget

BOT = "bot"
"""The scope of a whole platform account: every chat's sends count in it."""
CHAT = "chat"
"""The scope of one chat (platform, chat id, thread)."""


def _positive_int(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{attribute.name} must be a positive int, not {value!r}")


def _positive_seconds(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"{attribute.name} must be a positive number of seconds")


@attrs.frozen
class Limit:
    """At most ``sends`` hand-offs in any window of ``per`` seconds."""

    sends: int = attrs.field(validator=_positive_int)
    per: float = attrs.field(converter=float, validator=_positive_seconds)

    def scaled(self, factor: float) -> Limit:
        """The same limit on a clock running ``factor`` times slower (simulations)."""
        return Limit(self.sends, self.per * factor)


def never_group(_: DeliveryTarget) -> bool:
    return False


def telegram_group(target: DeliveryTarget) -> bool:
    """Telegram group and supergroup ids are negative; private chats' are positive."""
    return target.chat_id.startswith("-")


@attrs.frozen
class RateLimits:
    """One platform's limits. ``per_group`` replaces ``per_chat`` for the chats
    ``is_group`` names (Telegram's 20 a minute per group); None: no such limit."""

    per_bot: Limit | None = None
    per_chat: Limit | None = None
    per_group: Limit | None = None
    is_group: Callable[[DeliveryTarget], bool] = never_group

    @property
    def limited(self) -> bool:
        return self.per_bot is not None or self.per_chat is not None or self.per_group is not None

    def chat_limit(self, target: DeliveryTarget) -> Limit | None:
        if self.per_group is not None and self.is_group(target):
            return self.per_group
        return self.per_chat

    def scaled(self, factor: float) -> RateLimits:
        """Every window ``factor`` times as long (0.01: a hundred times faster)."""

        def scale(limit: Limit | None) -> Limit | None:
            return None if limit is None else limit.scaled(factor)

        return attrs.evolve(
            self,
            per_bot=scale(self.per_bot),
            per_chat=scale(self.per_chat),
            per_group=scale(self.per_group),
        )


UNLIMITED = RateLimits()

TELEGRAM = RateLimits(
    per_bot=Limit(30, 1.0),
    per_chat=Limit(1, 1.0),
    per_group=Limit(20, 60.0),
    is_group=telegram_group,
)
DISCORD = RateLimits(per_bot=Limit(50, 1.0), per_chat=Limit(5, 5.0))
SLACK = RateLimits(per_chat=Limit(1, 1.0))
WHATSAPP = RateLimits(per_bot=Limit(80, 1.0))

PRESETS: dict[str, RateLimits] = {
    "telegram": TELEGRAM,
    "discord": DISCORD,
    "slack": SLACK,
    "whatsapp": WHATSAPP,
}
"""The presets by platform name, for an adapter to declare (``rate_limits = PRESETS[...]``).
Nothing is applied to an adapter that declares nothing: only the adapter knows which
account tier and endpoint it sends through."""


def limits_of(adapter: object) -> RateLimits:
    """The adapter's declared ``rate_limits`` (none declared: no limit)."""
    declared = getattr(adapter, "rate_limits", None)
    if declared is None:
        return UNLIMITED
    if not isinstance(declared, RateLimits):
        raise InvalidInput("an adapter's rate_limits must be a RateLimits")
    return declared
