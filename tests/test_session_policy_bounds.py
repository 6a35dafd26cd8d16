"""Reset and auto-continue policies at their edges: bounds, types, spellings, time zones.

The README promises the defaults (idle 1440 minutes, daily at 04:00, a 3600 s
auto-continue window) and upstream's reason names, which are stored in session events;
the daily boundary must be right in zones east of UTC, where the local date runs ahead.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.sessions.policy import (
    DEFAULT_AUTO_CONTINUE_SECONDS,
    ResetMode,
    ResetPolicies,
    ResetPolicy,
    ResetReason,
    decide,
    latest_daily_boundary,
    reset_due,
)

TOKYO = ZoneInfo("Asia/Tokyo")  # UTC+9, no DST
KIRITIMATI = ZoneInfo("Pacific/Kiritimati")  # UTC+14: the local date is a day ahead
SYDNEY = ZoneInfo("Australia/Sydney")  # east of UTC, with DST in January
T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def test_the_defaults_are_upstreams() -> None:
    policy = ResetPolicy()
    assert (policy.mode, policy.idle_minutes, policy.at_hour) == (ResetMode.NONE, 1440, 4)
    assert DEFAULT_AUTO_CONTINUE_SECONDS == 3600.0


def test_modes_and_reasons_keep_their_stored_spellings() -> None:
    assert [m.value for m in ResetMode] == ["none", "idle", "daily", "both"]
    assert ResetPolicy(mode="both").mode is ResetMode.BOTH
    assert [r.value for r in ResetReason] == [
        "idle",
        "daily",
        "suspended",
        "resume_pending_expired",
        "session_reset",
        "session_switch",
    ]


@pytest.mark.parametrize("hour", [0, 1, 22, 23])
def test_every_hour_of_the_day_is_a_valid_reset_hour(hour: int) -> None:
    assert ResetPolicy(at_hour=hour).at_hour == hour


@pytest.mark.parametrize("hour", [-1, 24, True, 4.0, "4", None])
def test_a_reset_hour_outside_0_to_23_or_not_an_int_is_refused(hour: object) -> None:
    with pytest.raises(InvalidInput, match="at_hour must be an hour between 0 and 23"):
        ResetPolicy(at_hour=hour)  # type: ignore[arg-type]


def test_one_idle_minute_is_the_shortest_idle_limit() -> None:
    assert ResetPolicy(idle_minutes=1).idle_minutes == 1


@pytest.mark.parametrize("minutes", [0, -5, True, 1.5, "30", None])
def test_idle_minutes_must_be_a_positive_int(minutes: object) -> None:
    with pytest.raises(InvalidInput, match="idle_minutes must be a positive integer"):
        ResetPolicy(idle_minutes=minutes)  # type: ignore[arg-type]


def test_policy_maps_hold_only_policies() -> None:
    assert ResetPolicies(by_platform=None).by_platform == {}  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="policy for 'telegram'"):
        ResetPolicies(by_platform={"telegram": "daily"})  # type: ignore[dict-item]
    with pytest.raises(InvalidInput, match="policy for 'group'"):
        ResetPolicies(by_chat_type={"group": None})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("now", "hour", "zone", "boundary"),
    [
        # 03:30 JST on the 11th: today's 04:00 has not come, yesterday's has.
        (datetime(2026, 1, 10, 18, 30, tzinfo=UTC), 4, TOKYO, datetime(2026, 1, 9, 19, 0)),
        # 04:30 JST on the 11th: today's 04:00 (19:00 UTC on the 10th).
        (datetime(2026, 1, 10, 19, 30, tzinfo=UTC), 4, TOKYO, datetime(2026, 1, 10, 19, 0)),
        # exactly at the boundary: it counts as passed.
        (datetime(2026, 1, 10, 19, 0, tzinfo=UTC), 4, TOKYO, datetime(2026, 1, 10, 19, 0)),
        # midnight and 23:00 local, the extreme hours.
        (datetime(2026, 1, 10, 15, 0, tzinfo=UTC), 0, TOKYO, datetime(2026, 1, 10, 15, 0)),
        (datetime(2026, 1, 10, 14, 59, tzinfo=UTC), 0, TOKYO, datetime(2026, 1, 9, 15, 0)),
        (datetime(2026, 1, 10, 14, 0, tzinfo=UTC), 23, TOKYO, datetime(2026, 1, 10, 14, 0)),
        (datetime(2026, 1, 10, 13, 59, tzinfo=UTC), 23, TOKYO, datetime(2026, 1, 9, 14, 0)),
        # UTC+14: noon UTC on the 10th is 02:00 on the 11th there.
        (datetime(2026, 1, 10, 12, 0, tzinfo=UTC), 4, KIRITIMATI, datetime(2026, 1, 9, 14, 0)),
        (datetime(2026, 1, 10, 12, 0, tzinfo=UTC), 1, KIRITIMATI, datetime(2026, 1, 10, 11, 0)),
        # Sydney in summer is UTC+11.
        (datetime(2026, 1, 10, 16, 30, tzinfo=UTC), 4, SYDNEY, datetime(2026, 1, 9, 17, 0)),
        (datetime(2026, 1, 10, 17, 30, tzinfo=UTC), 4, SYDNEY, datetime(2026, 1, 10, 17, 0)),
        # UTC itself.
        (datetime(2026, 1, 10, 3, 59, tzinfo=UTC), 4, UTC, datetime(2026, 1, 9, 4, 0)),
    ],
)
def test_the_daily_boundary_east_of_utc(
    now: datetime, hour: int, zone: ZoneInfo, boundary: datetime
) -> None:
    found = latest_daily_boundary(now, hour, zone)
    assert found == boundary.replace(tzinfo=UTC)
    assert found.utcoffset() == timedelta(0)  # always reported in UTC
    assert found.astimezone(zone).hour == hour


def test_the_boundary_accepts_any_aware_now_and_refuses_a_naive_one() -> None:
    now = datetime(2026, 1, 11, 3, 30, tzinfo=TOKYO)  # the same instant as 18:30 UTC
    assert latest_daily_boundary(now, 4, TOKYO) == datetime(2026, 1, 9, 19, 0, tzinfo=UTC)
    with pytest.raises(InvalidInput, match="now must be timezone-aware"):
        latest_daily_boundary(datetime(2026, 1, 10, 12, 0), 4, TOKYO)


def test_a_session_active_exactly_at_the_boundary_is_not_reset() -> None:
    policy = ResetPolicy(mode="daily", at_hour=4)
    boundary = datetime(2026, 1, 10, 19, 0, tzinfo=UTC)  # 04:00 JST
    later = boundary + timedelta(hours=5)
    assert reset_due(policy, boundary, later, TOKYO) is None
    assert reset_due(policy, boundary - timedelta(seconds=1), later, TOKYO) is ResetReason.DAILY


def test_daily_reset_in_tokyo_follows_the_local_clock_not_utc() -> None:
    policy = ResetPolicy(mode="daily", at_hour=4)
    last = datetime(2026, 1, 10, 18, 0, tzinfo=UTC)  # 03:00 JST on the 11th
    assert reset_due(policy, last, datetime(2026, 1, 10, 18, 59, tzinfo=UTC), TOKYO) is None
    due = reset_due(policy, last, datetime(2026, 1, 10, 19, 0, tzinfo=UTC), TOKYO)
    assert due is ResetReason.DAILY
    # in UTC terms 04:00 has long passed that day, but the Tokyo day has not turned
    assert reset_due(policy, last, datetime(2026, 1, 10, 18, 30, tzinfo=UTC), UTC) is None


def test_idle_mode_ignores_the_daily_hour_and_daily_mode_ignores_idleness() -> None:
    last = datetime(2026, 1, 10, 18, 0, tzinfo=UTC)
    later = last + timedelta(hours=3)  # past 04:00 JST and past a 60-minute idle limit
    assert reset_due(ResetPolicy(mode="idle", idle_minutes=600), last, later, TOKYO) is None
    assert (
        reset_due(ResetPolicy(mode="daily", idle_minutes=60, at_hour=12), last, later, TOKYO)
        is None
    )
    assert (
        reset_due(ResetPolicy(mode="both", idle_minutes=60), last, later, TOKYO) is ResetReason.IDLE
    )


def test_reset_due_refuses_naive_times() -> None:
    with pytest.raises(InvalidInput, match="last_activity must be timezone-aware"):
        reset_due(ResetPolicy(mode="idle"), datetime(2026, 1, 1), T0, TOKYO)
    with pytest.raises(InvalidInput, match="now must be timezone-aware"):
        reset_due(ResetPolicy(mode="idle"), T0, datetime(2026, 1, 1), TOKYO)


def _decide(**kw: object) -> tuple[ResetReason | None, bool]:
    args: dict[str, object] = dict(
        pinned=False,
        suspended=False,
        resume_pending=False,
        last_activity=T0,
        now=T0 + timedelta(minutes=10),
        policy=ResetPolicy(mode="idle", idle_minutes=5),
        zone=TOKYO,
        auto_continue_seconds=3600.0,
    )
    args.update(kw)
    d = decide(**args)  # type: ignore[arg-type]
    return d.reset_reason, d.should_auto_continue


def test_a_pinned_session_continues_an_interrupted_turn() -> None:
    assert _decide(pinned=True, resume_pending=True) == (None, True)
    assert _decide(pinned=True, resume_pending=True, suspended=True) == (None, True)


def test_a_suspended_session_never_auto_continues() -> None:
    assert _decide(suspended=True, resume_pending=True) == (ResetReason.SUSPENDED, False)


def test_the_auto_continue_window_includes_its_last_second() -> None:
    day = ResetPolicy(mode="idle", idle_minutes=1440)  # the idle policy must not fire first
    at_edge = T0 + timedelta(seconds=3600)
    assert _decide(resume_pending=True, now=at_edge, policy=day) == (None, True)
    past = at_edge + timedelta(microseconds=1)
    assert _decide(resume_pending=True, now=past, policy=day) == (
        ResetReason.RESUME_PENDING_EXPIRED,
        False,
    )


def test_a_sub_second_window_still_gates_freshness() -> None:
    now = T0 + timedelta(seconds=1)
    assert _decide(resume_pending=True, now=now, auto_continue_seconds=0.5) == (
        ResetReason.RESUME_PENDING_EXPIRED,
        False,
    )
    assert _decide(resume_pending=True, now=now, auto_continue_seconds=-1) == (None, True)


def test_without_a_pending_resume_the_reset_policy_decides() -> None:
    assert _decide(now=T0 + timedelta(minutes=4)) == (None, False)
    assert _decide(now=T0 + timedelta(minutes=6)) == (ResetReason.IDLE, False)
    daily = ResetPolicy(mode="daily", at_hour=4)
    assert _decide(policy=daily, now=T0 + timedelta(days=1)) == (ResetReason.DAILY, False)
