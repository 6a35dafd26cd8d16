"""The synchronous API keeps the obligation it wrote last decrypted, for its next change.

A lifecycle (record -> attempting -> delivered) then reads nothing back. A kept copy never
decides alone: another writer's change makes a write on top of it fail on the version,
and the change is decided again on the stored state, exactly as without the copy (a
stale writer never wins). The copy goes with its data key: an erasure in this process
forgets it at once, through whichever ledger it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import IllegalTransition
from gateway_ledger.infrastructure.privacy.keyring import CACHE_TTL_ENV

KEY = "agent:main:telegram:dm:31"
OTHER = "agent:main:telegram:dm:32"


def record(ledger: DeliveryLedger, oid: str, key: str = KEY) -> None:
    ledger.record_obligation(
        obligation_id=oid, session_key=key, platform="telegram", chat_id="31", content="hi"
    )


@pytest.fixture
def ledger(store_location: str) -> Iterator[DeliveryLedger]:
    opened = DeliveryLedger.open(store_location)
    yield opened
    opened.close()


def reads(ledger: DeliveryLedger) -> list[Any]:
    """Every read of an aggregate's events from now on, as (id, gt, lte)."""
    seen: list[Any] = []
    select = ledger.recorder.select_events

    def watched(originator_id: Any, **kwargs: Any) -> Any:
        seen.append((originator_id, kwargs.get("gt"), kwargs.get("lte")))
        return select(originator_id, **kwargs)

    ledger.recorder.select_events = watched  # type: ignore[method-assign]
    return seen


def test_a_lifecycle_through_the_synchronous_api_reads_nothing_back(
    ledger: DeliveryLedger, store_location: str
) -> None:
    seen = reads(ledger)
    record(ledger, "o-1")
    ledger.mark_attempting("o-1")
    ledger.mark_delivered("o-1", "m-1")
    assert seen == []
    assert ledger.get("o-1").state == "delivered"  # reads always come from the store
    fresh = DeliveryLedger.open(store_location)
    assert [h.type for h in fresh.history("o-1")] == ["Recorded", "Attempting", "Delivered"]
    assert fresh.history("o-1")[2].fields["receipt"] == ["m-1"]
    fresh.close()


def test_a_copy_behind_the_store_is_decided_again_on_the_stored_state(
    ledger: DeliveryLedger, store_location: str
) -> None:
    record(ledger, "o-1")
    ledger.mark_attempting("o-1")  # kept: attempting, version 2
    other = DeliveryLedger.open(store_location)
    other.mark_failed("o-1", "HTTP 503", "rejected")  # the store moves on: failed, v3
    # The kept copy (attempting) refuses another attempt; the stored state allows it.
    ledger.mark_attempting("o-1")
    assert [h.type for h in other.history("o-1")] == [
        "Recorded",
        "Attempting",
        "Failed",
        "Attempting",
    ]
    other.mark_delivered("o-1", "m-1")  # v5, behind the copy kept at v4
    # The kept copy (attempting) would fail the send; the stored state (delivered) refuses.
    with pytest.raises(IllegalTransition):
        ledger.mark_failed("o-1", "timeout")
    history = other.history("o-1")
    assert [h.version for h in history] == [1, 2, 3, 4, 5]  # no gap, nothing stale won
    assert history[-1].type == "Delivered"
    other.close()


def test_an_erasure_forgets_the_kept_copies_of_its_session_only(
    ledger: DeliveryLedger, store_location: str
) -> None:
    record(ledger, "o-forgotten")
    record(ledger, "o-kept", key=OTHER)
    assert len(ledger.decrypted) == 2
    ledger.forget_session(KEY)
    assert len(ledger.decrypted) == 1
    kept_copy = ledger.decrypted.take(ledger.aggregate_id("o-kept"))
    assert kept_copy is not None and kept_copy.content == "hi"
    assert ledger.decrypted.take(ledger.aggregate_id("o-forgotten")) is None
    # The erased reply was abandoned; the synchronous API sees it as stored.
    with pytest.raises(IllegalTransition):
        ledger.mark_attempting("o-forgotten")
    assert ledger.get("o-forgotten").state == "abandoned"


def test_an_erasure_through_another_ledger_of_the_process_forgets_them_too(
    ledger: DeliveryLedger, store_location: str
) -> None:
    record(ledger, "o-1")
    record(ledger, "o-2", key=OTHER)
    operator = DeliveryLedger.open(store_location)
    operator.forget_session(KEY)
    operator.close()
    assert ledger.decrypted.take(ledger.aggregate_id("o-1")) is None
    assert ledger.decrypted.take(ledger.aggregate_id("o-2")) is not None


def test_nothing_is_kept_when_data_keys_are_not(
    store_location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_TTL_ENV, "0")
    ledger = DeliveryLedger.open(store_location)
    seen = reads(ledger)
    record(ledger, "o-1")
    ledger.mark_attempting("o-1")
    assert len(ledger.decrypted) == 0
    assert seen and {s[0] for s in seen} == {ledger.aggregate_id("o-1")}  # reloaded
    assert ledger.get("o-1").state == "attempting"
    ledger.close()


def test_an_erasure_forgets_copies_of_unknown_subject_without_reading_the_store(
    store_location: str,
) -> None:
    """A copy stored in clear has no subject this process knows without a read: an erasure
    anywhere in the process forgets it rather than read (a closed store may not answer)."""
    clear = DeliveryLedger.open(store_location, encrypt=False)
    record(clear, "o-clear", key=OTHER)
    assert len(clear.decrypted) == 1
    seen = reads(clear)
    operator = DeliveryLedger.open(store_location)
    operator.forget_session(KEY)
    operator.close()
    assert len(clear.decrypted) == 0 and seen == []
    clear.close()
