"""Reset policies and the auto-continue window, as pure functions of (state, now)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.policy import (
    ResetMode,
    ResetPolicies,
    ResetPolicy,
    ResetReason,
    decide,
    latest_daily_boundary,
    reset_due,
)

NY = ZoneInfo("America/New_York")
T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def test_none_never_resets() -> None:
    assert reset_due(ResetPolicy(), T0, T0 + timedelta(days=400), NY) is None


def test_idle_resets_after_idle_minutes() -> None:
    policy = ResetPolicy(mode="idle", idle_minutes=30)
    assert reset_due(policy, T0, T0 + timedelta(minutes=30), NY) is None
    assert reset_due(policy, T0, T0 + timedelta(minutes=31), NY) is ResetReason.IDLE


def test_daily_resets_once_the_local_hour_has_passed() -> None:
    policy = ResetPolicy(mode="daily", at_hour=4)
    last = datetime(2026, 1, 10, 3, 0, tzinfo=NY)
    assert reset_due(policy, last, datetime(2026, 1, 10, 3, 59, tzinfo=NY), NY) is None
    assert reset_due(policy, last, datetime(2026, 1, 10, 4, 0, tzinfo=NY), NY) is ResetReason.DAILY
    after = datetime(2026, 1, 10, 4, 1, tzinfo=NY)
    assert reset_due(policy, after, datetime(2026, 1, 11, 3, 59, tzinfo=NY), NY) is None


def test_daily_boundary_across_spring_forward() -> None:
    """2026-03-08: New York jumps from 02:00 EST to 03:00 EDT. 04:00 local is 08:00 UTC that
    day, not 09:00 UTC as a fixed -05:00 offset would say."""
    policy = ResetPolicy(mode="daily", at_hour=4)
    boundary = latest_daily_boundary(datetime(2026, 3, 8, 8, 30, tzinfo=UTC), 4, NY)
    assert boundary == datetime(2026, 3, 8, 8, 0, tzinfo=UTC)
    last = datetime(2026, 3, 8, 7, 30, tzinfo=UTC)  # 03:30 EDT
    assert reset_due(policy, last, datetime(2026, 3, 8, 7, 59, tzinfo=UTC), NY) is None
    assert reset_due(policy, last, datetime(2026, 3, 8, 8, 30, tzinfo=UTC), NY) is ResetReason.DAILY


def test_daily_boundary_across_fall_back() -> None:
    """2026-11-01: 02:00 EDT becomes 01:00 EST; 04:00 local is 09:00 UTC."""
    assert latest_daily_boundary(datetime(2026, 11, 1, 9, 30, tzinfo=UTC), 4, NY) == datetime(
        2026, 11, 1, 9, 0, tzinfo=UTC
    )
    assert latest_daily_boundary(datetime(2026, 11, 1, 8, 30, tzinfo=UTC), 4, NY) == datetime(
        2026, 10, 31, 8, 0, tzinfo=UTC
    )
    # at_hour=1 happens twice that night: the boundary is the first 01:00 (EDT).
    assert latest_daily_boundary(datetime(2026, 11, 1, 7, 0, tzinfo=UTC), 1, NY) == datetime(
        2026, 11, 1, 5, 0, tzinfo=UTC
    )


def test_both_mode_takes_either_reason() -> None:
    policy = ResetPolicy(mode=ResetMode.BOTH, idle_minutes=600, at_hour=4)
    last = datetime(2026, 1, 10, 3, 0, tzinfo=NY)
    assert reset_due(policy, last, datetime(2026, 1, 10, 4, 30, tzinfo=NY), NY) is ResetReason.DAILY
    assert reset_due(policy, last, datetime(2026, 1, 10, 13, 1, tzinfo=NY), NY) is ResetReason.IDLE


def test_precedence_platform_over_chat_type_over_default() -> None:
    policies = ResetPolicies(
        default=ResetPolicy(mode="none"),
        by_chat_type={"group": ResetPolicy(mode="idle")},
        by_platform={"telegram": ResetPolicy(mode="daily")},
    )
    assert policies.for_source("telegram", "group").mode is ResetMode.DAILY
    assert policies.for_source("discord", "group").mode is ResetMode.IDLE
    assert policies.for_source("discord", "dm").mode is ResetMode.NONE


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        ResetPolicy(mode="hourly")
    with pytest.raises(InvalidInput):
        ResetPolicy(at_hour=24)
    with pytest.raises(InvalidInput):
        ResetPolicy(idle_minutes=0)
    with pytest.raises(InvalidInput):
        reset_due(ResetPolicy(), datetime(2026, 1, 1), T0, NY)


def _decide(**kw: object) -> tuple[ResetReason | None, bool]:
    args: dict[str, object] = dict(
        pinned=False,
        suspended=False,
        resume_pending=False,
        last_activity=T0,
        now=T0 + timedelta(minutes=10),
        policy=ResetPolicy(mode="idle", idle_minutes=5),
        zone=NY,
        auto_continue_seconds=3600.0,
    )
    args.update(kw)
    d = decide(**args)  # type: ignore[arg-type]
    return d.reset_reason, d.should_auto_continue


def test_decide_follows_upstream_order() -> None:
    assert _decide() == (ResetReason.IDLE, False)
    assert _decide(pinned=True) == (None, False)
    assert _decide(pinned=True, suspended=True) == (None, False)
    assert _decide(suspended=True) == (ResetReason.SUSPENDED, False)
    # the idle/daily policy applies first, even to a pending resume (upstream's order)
    assert _decide(resume_pending=True) == (ResetReason.IDLE, False)
    # then the freshness window, counted from the moment the resume was marked
    day = ResetPolicy(mode="idle", idle_minutes=1440)
    late = T0 + timedelta(seconds=3601)
    assert _decide(resume_pending=True, policy=day) == (None, True)
    assert _decide(resume_pending=True, policy=day, now=late) == (
        ResetReason.RESUME_PENDING_EXPIRED,
        False,
    )
    fresh_mark = {"resume_marked_at": late - timedelta(minutes=1)}  # new traffic since: no matter
    assert _decide(resume_pending=True, policy=day, now=late, **fresh_mark) == (None, True)
    assert _decide(resume_pending=True, policy=day, now=late, auto_continue_seconds=0) == (
        None,
        True,
    )
    assert _decide(resume_pending=True, policy=day, now=late, auto_continue_seconds=7200) == (
        None,
        True,
    )
    # reset mode none (the default) turns the window off: the interrupted turn resumes
    days_later = T0 + timedelta(days=3)
    assert _decide(resume_pending=True, policy=ResetPolicy(), now=days_later) == (None, True)
