"""The duplicate audit knows reconciliation (ADR 0050): every outcome, on a real store.

``arrived`` settles a reply with no re-send; ``not_arrived`` makes the plain re-send after
it fine; ``unknown`` leaves the labelled re-send a possible duplicate; a re-send after
``arrived`` is a problem; a failure after acceptance makes the plain re-send fine. Each
answer given while the marker was up is a possible duplicate avoided.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway_ledger.application.delivery.audit import DuplicateAuditor
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import DeliveryObligation
from gateway_ledger.domain.values import LedgerPolicy, OwnerIdentity

CLAIMER = OwnerIdentity(host="other-host", boot_id="b", pid=4242, start_time=1)


@pytest.fixture
def ledger(store_location: str) -> Any:
    opened = DeliveryLedger.open(store_location)
    yield opened
    opened.close()


def uncertain(ledger: DeliveryLedger, oid: str) -> None:
    """Recorded, sent plain, and the send timed out after it may have left."""
    ledger.record_obligation(
        obligation_id=oid, session_key="agent:main:whatsapp:dm:1", platform="whatsapp",
        chat_id="1", content=f"reply {oid}",
    )  # fmt: skip
    ledger.mark_attempting(oid, guard="none")
    ledger.mark_failed(oid, "timeout", "ambiguous")


def reconcile(
    ledger: DeliveryLedger, oid: str, outcome: str, ids: tuple[str, ...] = (), by: Any = None
) -> None:
    obligation: DeliveryObligation = ledger.load(oid)
    obligation.reconcile(
        by=by or ledger.owner, now=ledger.clock(), outcome=outcome, message_ids=ids
    )
    ledger.save(obligation)


def claim(ledger: DeliveryLedger, oid: str, gone: bool = True) -> None:
    """``gone``: the previous owner's process was proven gone (else its lease lapsed)."""
    obligation: DeliveryObligation = ledger.load(oid)
    obligation.claim(
        by=CLAIMER, now=ledger.clock(), policy=LedgerPolicy(), previous_owner_gone=gone
    )
    ledger.save(obligation)


def test_every_outcome(ledger: DeliveryLedger) -> None:
    # arrived: settled, no re-send, one duplicate avoided
    uncertain(ledger, "o-arrived")
    reconcile(ledger, "o-arrived", "arrived", ("wa-1",))

    # not_arrived: the plain re-send is fine, one duplicate avoided
    uncertain(ledger, "o-not-arrived")
    reconcile(ledger, "o-not-arrived", "not_arrived")
    ledger.mark_attempting("o-not-arrived", guard="none")
    ledger.mark_delivered("o-not-arrived", ["wa-2"])

    # unknown: re-sent with the marker, a labelled possible duplicate
    uncertain(ledger, "o-unknown")
    reconcile(ledger, "o-unknown", "unknown")
    ledger.mark_attempting("o-unknown", guard="marker")
    ledger.mark_delivered("o-unknown", ["wa-3"])

    # unknown, then re-sent plain anyway: a problem, as without reconciliation
    uncertain(ledger, "o-unknown-plain")
    reconcile(ledger, "o-unknown-plain", "unknown")
    ledger.mark_attempting("o-unknown-plain", guard="none")

    # a claimer's not_arrived: its own send goes plain, and that is fine
    uncertain(ledger, "o-claimed")
    claim(ledger, "o-claimed")
    reconcile(ledger, "o-claimed", "not_arrived", by=CLAIMER)

    # a claimer's not_arrived while the previous owner is only presumed gone (its lease
    # lapsed; it may be paused with a send still to land): proves nothing, the claim's
    # send keeps the marker, a labelled possible duplicate, none avoided
    uncertain(ledger, "o-claimed-lapsed")
    claim(ledger, "o-claimed-lapsed", gone=False)
    reconcile(ledger, "o-claimed-lapsed", "not_arrived", by=CLAIMER)
    lapsed: DeliveryObligation = ledger.load("o-claimed-lapsed")
    lapsed.fail(by=CLAIMER, now=ledger.clock(), error="", classification="rejected")
    lapsed.start_attempt(by=CLAIMER, now=ledger.clock(), guard="marker")
    assert lapsed.arrived_before_this_send is True
    lapsed.confirm_delivery(by=CLAIMER, now=ledger.clock(), receipt=["wa-8"])
    ledger.save(lapsed)

    # a claimer's arrived: the claim's send never left; settled
    uncertain(ledger, "o-claimed-arrived")
    claim(ledger, "o-claimed-arrived")
    reconcile(ledger, "o-claimed-arrived", "arrived", ("wa-5",), by=CLAIMER)

    # failed after acceptance: the plain re-send is fine
    ledger.record_obligation(
        obligation_id="o-dropped", session_key="agent:main:whatsapp:dm:1",
        platform="whatsapp", chat_id="1", content="dropped",
    )  # fmt: skip
    ledger.mark_attempting("o-dropped", guard="none")
    ledger.mark_delivered("o-dropped", ["wa-6"])
    ledger.report_status("o-dropped", "failed_after_acceptance", None, "", "wa-6")
    ledger.mark_attempting("o-dropped", guard="none")
    ledger.mark_delivered("o-dropped", ["wa-7"])

    audit = ledger.audit_duplicates()
    assert audit.reconciled == {"arrived": 2, "not_arrived": 3, "unknown": 2}
    assert audit.avoided_duplicates == 4
    assert [(f.kind, f.obligation_id) for f in audit.findings] == [
        ("unmarked_resend", "o-unknown-plain")
    ]
    duplicates = {d.obligation_id: d.labelled for d in audit.possible_duplicates}
    assert duplicates == {
        "o-unknown": True,
        "o-unknown-plain": False,
        "o-claimed-lapsed": True,
    }
    assert ledger.get("o-arrived").state == "delivered"
    assert ledger.get("o-claimed-arrived").state == "delivered"
    report = audit.to_dict()
    assert report["avoided_duplicates"] == 4 and report["reconciled"]["unknown"] == 2


def test_a_send_after_arrived_is_a_problem(ledger: DeliveryLedger) -> None:
    """No command can start a send after ``arrived`` settled the reply; a history that
    shows one anyway (a buggy or foreign writer) is flagged: its stored ``Attempting`` is
    replayed once more after the settling events."""
    uncertain(ledger, "o-1")
    reconcile(ledger, "o-1", "arrived", ("wa-1",))
    notes = ledger.recorder.select_notifications(0, 100)
    auditor = DuplicateAuditor()
    for n in notes:
        auditor.feed(n.originator_id, n.originator_version, n.topic, n.state)
    attempt = next(n for n in notes if n.topic.endswith(".Attempting"))
    auditor.feed(attempt.originator_id, notes[-1].originator_version + 1, attempt.topic,
                 attempt.state)  # fmt: skip
    report = auditor.report(0.0)
    # and, sent plain after a send that arrived, an unmarked re-send too
    assert [f.kind for f in report.findings] == ["resend_after_arrived", "unmarked_resend"]
    assert report.avoided_duplicates == 1
