"""Reset and auto-continue policies, as values and pure functions of (state, now).

Precedence: platform > chat type > default (upstream). Daily resets happen at ``at_hour`` in
a configured time zone, computed with real zone rules, so a DST change moves the instant in
UTC but not the local hour. The application turns a zone name into a ``tzinfo``; the domain
only receives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from enum import StrEnum
from typing import Any

import attrs

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import require_aware, require_choice

DEFAULT_IDLE_MINUTES = 1440
DEFAULT_AT_HOUR = 4
DEFAULT_AUTO_CONTINUE_SECONDS = 3600.0


class ResetMode(StrEnum):
    NONE = "none"
    IDLE = "idle"
    DAILY = "daily"
    BOTH = "both"


class ResetReason(StrEnum):
    """Why a session ended; the automatic ones are upstream's end reasons."""

    IDLE = "idle"
    DAILY = "daily"
    SUSPENDED = "suspended"
    RESUME_PENDING_EXPIRED = "resume_pending_expired"
    SESSION_RESET = "session_reset"  # manual /reset or /new
    SESSION_SWITCH = "session_switch"


def _positive(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"{attribute.name} must be a positive integer")


def _hour(_: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 23:
        raise InvalidInput(f"{attribute.name} must be an hour between 0 and 23")


def _reset_mode(value: object) -> ResetMode:
    return require_choice("reset mode", value, ResetMode)


@attrs.frozen
class ResetPolicy:
    mode: ResetMode = attrs.field(default=ResetMode.NONE, converter=_reset_mode)
    idle_minutes: int = attrs.field(default=DEFAULT_IDLE_MINUTES, validator=_positive)
    at_hour: int = attrs.field(default=DEFAULT_AT_HOUR, validator=_hour)


def _policy_map(value: Mapping[str, ResetPolicy] | None) -> dict[str, ResetPolicy]:
    result = dict(value or {})
    for name, policy in result.items():
        if not isinstance(policy, ResetPolicy):
            raise InvalidInput(f"policy for {name!r} must be a ResetPolicy")
    return result


@attrs.frozen
class ResetPolicies:
    """The configured policies; ``for_source`` applies platform > chat type > default."""

    default: ResetPolicy = attrs.field(factory=ResetPolicy)
    by_platform: dict[str, ResetPolicy] = attrs.field(factory=dict, converter=_policy_map)
    by_chat_type: dict[str, ResetPolicy] = attrs.field(factory=dict, converter=_policy_map)

    def for_source(self, platform: str, chat_type: str) -> ResetPolicy:
        if platform in self.by_platform:
            return self.by_platform[platform]
        if chat_type in self.by_chat_type:
            return self.by_chat_type[chat_type]
        return self.default


def latest_daily_boundary(now: datetime, at_hour: int, zone: tzinfo) -> datetime:
    """The most recent instant <= now at which the local clock in ``zone`` read ``at_hour:00``."""
    require_aware("now", now)
    local_now = now.astimezone(zone)
    day: date = local_now.date()
    for _ in range(3):
        # In UTC: an ambiguous local time (DST fall-back) never compares equal across zones.
        candidate = datetime.combine(day, time(at_hour), tzinfo=zone).astimezone(UTC)
        if candidate <= now:
            return candidate
        day -= timedelta(days=1)
    raise AssertionError("unreachable: a daily boundary lies within the last two days")


def reset_due(
    policy: ResetPolicy, last_activity: datetime, now: datetime, zone: tzinfo
) -> ResetReason | None:
    """Idle or daily reset due for a session last active at ``last_activity``?"""
    require_aware("last_activity", last_activity)
    require_aware("now", now)
    if policy.mode in (ResetMode.IDLE, ResetMode.BOTH) and now - last_activity > timedelta(
        minutes=policy.idle_minutes
    ):
        return ResetReason.IDLE
    daily = policy.mode in (ResetMode.DAILY, ResetMode.BOTH)
    if daily and last_activity < latest_daily_boundary(now, policy.at_hour, zone):
        return ResetReason.DAILY
    return None


@attrs.frozen
class RouteDecision:
    """What ``decide`` concluded for the current session of a key."""

    reset_reason: ResetReason | None
    should_auto_continue: bool


def decide(
    *,
    pinned: bool,
    suspended: bool,
    resume_pending: bool,
    last_activity: datetime,
    now: datetime,
    policy: ResetPolicy,
    zone: tzinfo,
    auto_continue_seconds: float,
    resume_marked_at: datetime | None = None,
) -> RouteDecision:
    """Upstream's order (``get_or_create_session``): a pinned session keeps everything; then
    a suspended one resets (``suspended``); then the idle/daily policy applies, even to a
    pending resume (``idle``/``daily``); only then the freshness window of a pending resume,
    counted from ``resume_marked_at`` (the last activity when unknown), so new traffic
    cannot keep a stuck resume alive: older than the window it resets
    (``resume_pending_expired``). A window <= 0, or reset mode ``none`` (the user opted out
    of every automatic reset), turns the window off: the interrupted turn is resumed."""
    if pinned:
        return RouteDecision(None, resume_pending)
    if suspended:
        return RouteDecision(ResetReason.SUSPENDED, False)
    due = reset_due(policy, last_activity, now, zone)
    if due is not None:
        return RouteDecision(due, False)
    if not resume_pending:
        return RouteDecision(None, False)
    marked = (
        last_activity
        if resume_marked_at is None
        else require_aware("resume_marked_at", resume_marked_at)
    )
    window_on = policy.mode is not ResetMode.NONE and auto_continue_seconds > 0
    if window_on and (now - marked).total_seconds() > auto_continue_seconds:
        return RouteDecision(ResetReason.RESUME_PENDING_EXPIRED, False)
    return RouteDecision(None, True)
