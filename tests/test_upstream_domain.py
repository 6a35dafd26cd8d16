"""The domain facts issue 16 added, on their own: a session reopened by a switch back, and
the ``Imported`` fact of an obligation brought from an upstream installation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.sessions.policy import ResetReason
from gateway_ledger.domain.sessions.session import Session
from gateway_ledger.domain.sessions.source import SessionSource
from gateway_ledger.domain.values import DeliveryTarget, OwnerIdentity

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SID, NEXT = "20260101_000000_0123abcd", "20260101_010000_89abcdef"
OWNER = OwnerIdentity(host="h", boot_id="b", pid=7, start_time=1)


def test_a_session_switched_back_to_is_reopened() -> None:
    s = Session.start(session_id=SID, key="k", source=SessionSource(platform="p"), now=T0)
    s.reopen(reason=ResetReason.SESSION_SWITCH, now=T0)  # open already: nothing recorded
    assert s.version == 1
    s.suspend(now=T0)
    s.reset(reason=ResetReason.SESSION_SWITCH, successor_session_id=NEXT, now=T0)
    with pytest.raises(IllegalTransition):
        s.append_message(role="user", content="x", now=T0)
    s.reopen(reason="session_switch", now=T0 + timedelta(seconds=1))
    assert (s.ended, s.end_reason, s.successor_session_id, s.suspended) == (
        False,
        None,
        None,
        False,
    )
    assert s.append_message(role="user", content="back", now=T0) == 1
    with pytest.raises(ValueError):
        s.reopen(reason="because", now=T0)
    with pytest.raises(InvalidInput):
        s.reopen(reason=ResetReason.SESSION_SWITCH, now=datetime(2026, 1, 1))


def recorded() -> DeliveryObligation:
    return DeliveryObligation.record(
        obligation_id="a" * 24,
        session_key="k",
        target=DeliveryTarget(platform="telegram", chat_id="1"),
        content="x",
        owner=OWNER,
        now=T0,
    )


def note(o: DeliveryObligation, **kw: object) -> None:
    args: dict[str, object] = dict(
        source="hermes", source_state="pending", attempts=0, last_error="", created_at=1.0,
        updated_at=2.0, time_basis="utc", now=T0,
    )  # fmt: skip
    args.update(kw)
    o.note_import(**args)  # type: ignore[arg-type]


def test_the_imported_fact_says_what_the_row_said() -> None:
    o = recorded()
    note(o, source_state="attempting", attempts=2, last_error="e" * 600, now=T0 + timedelta(1))
    fact = o.collect_events()[-1]
    assert isinstance(fact, DeliveryObligation.Imported)
    assert (fact.source, fact.source_state, fact.attempts) == ("hermes", "attempting", 2)
    assert (fact.created_at, fact.updated_at, fact.time_basis) == (1.0, 2.0, "utc")
    assert fact.possibly_sent and len(fact.last_error) == 500  # cut like upstream's
    assert o.last_transition_at == T0 + timedelta(1) and o.state == "pending"
    for state, attempts, sent in (("pending", 0, False), ("pending", 1, True), ("failed", 0, True)):
        fresh = recorded()
        note(fresh, source_state=state, attempts=attempts)
        assert fresh.collect_events()[-1].possibly_sent is sent  # type: ignore[attr-defined]


def test_the_imported_fact_is_refused_unless_first_and_well_formed() -> None:
    o = recorded()
    note(o)
    with pytest.raises(IllegalTransition, match="imported"):
        note(o)  # only right after Recorded
    for bad in (
        {"attempts": -1},
        {"attempts": True},
        {"created_at": float("nan")},
        {"updated_at": "soon"},
        {"last_error": None},
        {"source": ""},
        {"source_state": ""},
        {"time_basis": "a\x00b"},
        {"now": datetime(2026, 1, 1)},
    ):
        fresh = recorded()
        with pytest.raises(InvalidInput, match=f"^{next(iter(bad))} "):
            note(fresh, **bad)
        assert fresh.version == 1
