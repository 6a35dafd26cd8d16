"""The obligation's reconciliation and status rules (ADR 0050), on the pure aggregate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway_ledger.domain.delivery.marker import Marker
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.errors import IllegalTransition, InvalidInput
from gateway_ledger.domain.values import (
    DeliveryTarget,
    ErrorClass,
    LedgerPolicy,
    ObligationState,
    OwnerIdentity,
    QuarantineReason,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A = OwnerIdentity(host="gw-a", boot_id="b", pid=10, start_time=1)
B = OwnerIdentity(host="gw-b", boot_id="b", pid=11, start_time=1)


def obligation(parts: tuple[str, ...] = ()) -> DeliveryObligation:
    return DeliveryObligation.record(
        obligation_id="o-1",
        session_key="k",
        target=DeliveryTarget(platform="whatsapp", chat_id="1"),
        content="".join(parts) or "hello",
        parts=list(parts),
        owner=A,
        now=T0,
    )


def after_ambiguous(parts: tuple[str, ...] = ()) -> DeliveryObligation:
    agg = obligation(parts)
    agg.start_attempt(by=A, now=T0, guard="none")
    agg.fail(by=A, now=T0, classification=ErrorClass.AMBIGUOUS)
    assert agg.marker == Marker(True, False)
    return agg


def kinds(agg: DeliveryObligation) -> list[str]:
    return [type(e).__name__ for e in agg.collect_events()]


def test_arrived_settles_it_delivered_with_the_platforms_ids() -> None:
    agg = after_ambiguous()
    agg.reconcile(by=A, now=T0, outcome="arrived", message_ids=["wa-1"], evidence="nonce")
    assert agg.state is ObligationState.DELIVERED and agg.receipt == ["wa-1"]
    assert kinds(agg)[-2:] == ["Reconciled", "Delivered"]


def test_not_arrived_strikes_off_every_earlier_send() -> None:
    agg = after_ambiguous()
    agg.reconcile(by=A, now=T0, outcome="not_arrived", evidence="history covers it")
    assert agg.marker == Marker(False, False) and agg.state is ObligationState.FAILED
    agg.start_attempt(by=A, now=T0, guard="none")
    assert agg.arrived_before_this_send is False  # the re-send goes without the marker


def test_unknown_changes_nothing_but_the_history() -> None:
    agg = after_ambiguous()
    agg.reconcile(by=A, now=T0, outcome="unknown", evidence="rate limited")
    assert agg.marker == Marker(True, False) and agg.state is ObligationState.FAILED
    assert kinds(agg)[-1] == "Reconciled"


def test_a_claimers_send_still_counts_as_started_after_not_arrived() -> None:
    agg = after_ambiguous()
    agg.claim(by=B, now=T0, policy=LedgerPolicy(), previous_owner_gone=True)
    assert agg.marker == Marker(True, True)
    agg.reconcile(by=B, now=T0, outcome="not_arrived")
    # The claimer's send goes plain, yet a crash after it leaves the marker up.
    assert agg.marker == Marker(True, False)
    events: list[Any] = list(agg.collect_events())
    assert events[-1].claim_pending is True and events[-1].may_have_arrived is True
    assert events[-1].stray_send_possible is False


def test_not_arrived_proves_nothing_while_a_presumed_gone_owner_may_still_send() -> None:
    """Found by ``simulate --faults`` on PostgreSQL: an owner paused (SIGSTOP) past its
    lease is claimed; the platform truthfully answers "not arrived"; the paused owner
    resumes and its send lands after the answer. A lapsed lease is not proof that its
    send will never land, so the answer strikes nothing off, now or later."""
    agg = after_ambiguous()
    agg.claim(by=B, now=T0, policy=LedgerPolicy())  # lease lapsed: presumed gone only
    agg.reconcile(by=B, now=T0, outcome="not_arrived", evidence="history covers it")
    assert agg.marker == Marker(True, True)  # the claimer's send keeps the marker
    events: list[Any] = list(agg.collect_events())
    assert events[-2].previous_owner_gone is False
    assert events[-1].stray_send_possible is True and events[-1].may_have_arrived is True
    agg.fail(by=B, now=T0, classification=ErrorClass.AMBIGUOUS)  # the claim's send
    agg.reconcile(by=B, now=T0, outcome="not_arrived")  # its own retry: still nothing proven
    assert agg.marker.may_have_arrived is True
    # The same answer after a claim from an owner proven gone strikes everything off.
    proven = after_ambiguous()
    proven.claim(by=B, now=T0, policy=LedgerPolicy(), previous_owner_gone=True)
    proven.fail(by=B, now=T0, classification=ErrorClass.AMBIGUOUS)
    proven.reconcile(by=B, now=T0, outcome="not_arrived")
    assert proven.marker == Marker(False, False)


def test_a_part_that_arrived_is_confirmed_and_the_rest_goes_plain() -> None:
    agg = after_ambiguous(("aa", "bb", "cc"))
    agg.reconcile(by=A, now=T0, outcome="arrived", message_ids=["p0"], part=0)
    assert agg.part_delivered(0) and agg.state is ObligationState.FAILED
    assert agg.marker == Marker(False, False)
    agg.reconcile(by=A, now=T0, outcome="unknown")  # asked again: nothing changes
    agg.start_attempt(by=A, now=T0)
    agg.acknowledge_part(by=A, now=T0, index=1, receipt=["p1"])
    agg.fail(by=A, now=T0, classification="ambiguous")
    agg.reconcile(by=A, now=T0, outcome="arrived", message_ids=["p2"], part=2)
    assert agg.state is ObligationState.DELIVERED and agg.receipt == ["p0", "p1", "p2"]


@pytest.mark.parametrize(
    ("outcome", "ids", "part", "error"),
    [
        ("arrived", [], None, InvalidInput),  # an arrival names the ids
        ("not_arrived", ["x"], None, InvalidInput),  # no ids where none belong
        ("maybe", [], None, InvalidInput),
        ("arrived", ["x"], 7, InvalidInput),  # no such part
    ],
)
def test_bad_answers_are_refused_before_any_event(
    outcome: str, ids: list[str], part: int | None, error: type[Exception]
) -> None:
    agg = after_ambiguous()
    before = agg.version
    with pytest.raises(error):
        agg.reconcile(by=A, now=T0, outcome=outcome, message_ids=ids, part=part)
    assert agg.version == before


def test_only_the_owner_reconciles_and_never_a_settled_or_quarantined_one() -> None:
    agg = after_ambiguous()
    with pytest.raises(IllegalTransition, match="fenced out"):
        agg.reconcile(by=B, now=T0, outcome="unknown")
    agg.quarantine(reason=QuarantineReason.UNREADABLE, found_at=1, by=A, now=T0)
    with pytest.raises(IllegalTransition, match="quarantined"):
        agg.reconcile(by=A, now=T0, outcome="unknown")
    done = obligation()
    done.start_attempt(by=A, now=T0)
    done.confirm_delivery(by=A, now=T0, receipt=["m"])
    with pytest.raises(IllegalTransition, match="reconciled"):
        done.reconcile(by=A, now=T0, outcome="unknown")


def delivered(parts: tuple[str, ...] = ()) -> DeliveryObligation:
    agg = obligation(parts)
    agg.start_attempt(by=A, now=T0, guard="none")
    for i in range(len(parts) - 1):
        agg.acknowledge_part(by=A, now=T0, index=i, receipt=[f"m{i}"])
    agg.confirm_delivery(by=A, now=T0, receipt=[f"m{i}" for i in range(max(1, len(parts)))])
    return agg


def test_statuses_go_forward_only_and_a_late_one_changes_nothing() -> None:
    agg = delivered()
    at = T0 + timedelta(seconds=5)
    assert agg.report_status(status="delivered_to_device", at=at, now=at, message_id="m0")
    assert agg.report_status(status="read", at=at, now=at)
    before = agg.version
    assert not agg.report_status(status="delivered_to_device", at=at, now=at)  # backwards
    assert not agg.report_status(status="read", at=at, now=at)  # repeated
    assert not agg.report_status(status="failed_after_acceptance", at=at, now=at)
    assert not agg.report_status(status="read", at=at, now=at, message_id="elsewhere")
    assert agg.version == before and agg.state is ObligationState.DELIVERED


def test_failed_after_acceptance_reopens_it_without_the_marker() -> None:
    agg = delivered()
    assert agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="m0")
    assert agg.state is ObligationState.FAILED and agg.marker == Marker(False, False)
    assert agg.failures_after_acceptance == 1
    # the same callback again changes nothing; a status while reopened is refused by name
    assert not agg.report_status(status="failed_after_acceptance", at=T0, now=T0)
    with pytest.raises(IllegalTransition, match="status read"):
        agg.report_status(status="read", at=T0, now=T0)
    agg.start_attempt(by=A, now=T0)
    assert agg.arrived_before_this_send is False  # re-sent plain


def test_a_failed_earlier_part_is_sent_again_alone() -> None:
    agg = delivered(("aa", "bb", "cc"))
    assert agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="m0")
    assert not agg.part_delivered(0)
    assert agg.part_delivered(1) and agg.part_delivered(2)
    assert agg.delivered_parts["2"] == ["m2"]


def test_a_second_part_dropped_while_reopened_is_owed_again_too() -> None:
    """Two parts dropped after acceptance: the second callback lands while the first has
    reopened it; it is recorded, and both parts are sent again (none lost)."""
    agg = delivered(("aa", "bb", "cc"))
    assert agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="m0")
    assert agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="m2")
    assert not agg.part_delivered(0) and not agg.part_delivered(2)
    assert agg.part_delivered(1) and agg.failures_after_acceptance == 2
    # the same callback again changes nothing; one about an unknown message neither
    assert not agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="m2")
    with pytest.raises(IllegalTransition, match="status failed_after_acceptance"):
        agg.report_status(status="failed_after_acceptance", at=T0, now=T0, message_id="zz")


def test_a_status_before_delivered_is_refused_by_name() -> None:
    agg = obligation()
    agg.start_attempt(by=A, now=T0)
    with pytest.raises(IllegalTransition, match="status read"):
        agg.report_status(status="read", at=T0, now=T0)
    with pytest.raises(InvalidInput):
        agg.report_status(status="seen", at=T0, now=T0)
