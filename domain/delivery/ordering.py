"""Per-chat order and pacing, as the domain records them (ADR 0065).

Replies to one delivery target go to it in the order they were recorded. When a send
waits, its obligation records ``Waited`` with one of :class:`WaitReason`; when a reply
goes before an earlier one still unresolved, it records ``OrderReleased`` with one of
:class:`OrderRelease`, so that no reply ever overtakes another without a trace.
"""

from __future__ import annotations

import enum
import math

from gateway_ledger.domain.errors import InvalidInput


class WaitReason(enum.StrEnum):
    ORDER = "order"
    """Behind an earlier reply to the same chat."""
    RATE = "rate"
    """For the platform's rate budget (the bot's, or the chat's)."""
    PAUSE = "pause"
    """Out a pause the platform asked for (``retry_after``)."""


class OrderRelease(enum.StrEnum):
    TIMEOUT = "timeout"
    """The earlier reply stayed unresolved past the policy's ``order_wait``."""
    PARKED = "parked"
    """The earlier reply is left to a later boot sweep (runtime retries spent, or its
    platform not connected): it will not be sent by a running gateway."""


def require_wait(name: str, value: object) -> float:
    """Seconds waited: a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number of seconds")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{name} must be finite and not negative")
    return seconds
