"""Concurrency with real processes: optimistic concurrency on the aggregate version is the lock.

(a) Two processes, each with its own DeliveryLedger on one store, drive the same obligation
at the same moment. Their clocks wait on a shared barrier, and a ledger reads its clock
after loading the obligation and before saving it, so both have loaded the same version
when they save: exactly one transition wins, the other gets ConcurrentUpdate.

(b) Four writer processes hammer one fresh SQLite file (connection set-up, table creation
and writes all racing) with the default busy timeout: no OperationalError ever surfaces,
and every event a writer was told it appended is in the store.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.application.clock import system_clock
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import ConcurrentUpdate, IllegalTransition

SPAWN = multiprocessing.get_context("spawn")
KEY = "agent:main:telegram:dm:42"
OID = "race0000000000000000000a"


def record(ledger: DeliveryLedger, oid: str) -> str:
    return ledger.record_obligation(
        obligation_id=oid, session_key=KEY, platform="telegram", chat_id="42", content=oid
    )


# -- (a) two processes, one obligation, one moment ---------------------------------------------


def _racer(location: str, command: str, barrier: Any, results: Any) -> None:
    def clock_at_the_barrier() -> datetime:
        barrier.wait(timeout=30)  # both have loaded the same version by now
        return system_clock()

    ledger = None
    try:
        ledger = DeliveryLedger.open(location, clock=clock_at_the_barrier)
        if command == "attempting":
            ledger.mark_attempting(OID)
        elif command == "delivered":
            ledger.mark_delivered(OID, ["m-1"])
        else:
            ledger.mark_failed(OID, "timeout", "ambiguous")
        results.put((command, "won", ""))
    except ConcurrentUpdate as e:
        results.put((command, "ConcurrentUpdate", str(e)))
    except BaseException as e:  # anything else is a finding, reported to the parent
        results.put((command, type(e).__name__, traceback.format_exc()))
    finally:
        if ledger is not None:
            ledger.close()


def race(location: str, commands: tuple[str, str]) -> list[tuple[str, str, str]]:
    barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
    procs = [SPAWN.Process(target=_racer, args=(location, c, barrier, results)) for c in commands]
    for p in procs:
        p.start()
    outcomes = []
    for _ in procs:
        try:
            outcomes.append(results.get(timeout=120))
        except queue.Empty:
            codes = [p.exitcode for p in procs]
            pytest.fail(
                f"a racer reported nothing within 120 s; exit codes {codes}, got {outcomes}"
            )
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return sorted(outcomes, key=lambda o: o[1] != "won")


@pytest.mark.parametrize(
    "prepare, commands, winner_event",
    [
        ([], ("attempting", "attempting"), "Attempting"),
        (["attempting"], ("delivered", "failed"), None),
    ],
)
def test_two_processes_racing_one_transition_one_wins(
    store_location: str, prepare: list[str], commands: tuple[str, str], winner_event: str | None
) -> None:
    ledger = DeliveryLedger.open(store_location)
    record(ledger, OID)
    for step in prepare:
        assert step == "attempting"
        ledger.mark_attempting(OID)
    version_before = len(ledger.history(OID))

    (won, lost) = race(store_location, commands)

    assert won[1] == "won", won
    assert lost[1] == "ConcurrentUpdate", lost
    assert lost[2] == (
        f"DeliveryObligation {OID} was changed by another writer while {lost[0]} was being "
        "recorded; reload and decide again"
    )
    history = DeliveryLedger.open(store_location).history(OID)
    assert [h.version for h in history] == list(range(1, version_before + 2))  # no gap, no dup
    expected = winner_event or {"delivered": "Delivered", "failed": "Failed"}[won[0]]
    assert history[-1].type == expected
    assert ledger.get(OID).state == won[0]


# -- (b) four writers hammering one SQLite file --------------------------------------------------

WRITERS = 4
OWN_PER_WRITER = 30
SHARED = [f"shared{i:018d}" for i in range(6)]
DRIVE = ("attempting", "failed", "attempting", "delivered")
EXPECTED = (ConcurrentUpdate, IllegalTransition)  # the losers of a race on a shared obligation


def _hammer(location: str, writer: int, barrier: Any, results: Any) -> None:
    appended: list[tuple[str, str]] = []  # (obligation, event) this writer was told it appended
    expected: Counter[str] = Counter()
    errors: list[str] = []
    try:
        barrier.wait(timeout=60)  # start together, on a file nobody has created yet
        ledger = DeliveryLedger.open(location)
        own = [f"w{writer}-{i:020d}" for i in range(OWN_PER_WRITER)]
        for n, oid in enumerate(own):
            for obligation in (oid, SHARED[n % len(SHARED)]):
                try:
                    existed = ledger.exists(obligation)
                    record(ledger, obligation)
                    if not existed and obligation == oid:
                        appended.append((obligation, "Recorded"))
                except Exception:
                    errors.append(traceback.format_exc())
            for step in DRIVE:
                for obligation in (oid, SHARED[n % len(SHARED)]):
                    try:
                        if step == "attempting":
                            ledger.mark_attempting(obligation)
                        elif step == "failed":
                            ledger.mark_failed(obligation, "HTTP 503", "rejected")
                        else:
                            ledger.mark_delivered(obligation, [f"{writer}-{n}"])
                        appended.append((obligation, step))
                    except EXPECTED as e:
                        if obligation == oid:
                            errors.append(f"own obligation {oid}: {e!r}")
                        expected[type(e).__name__] += 1
                    except Exception:
                        errors.append(traceback.format_exc())
        ledger.close()
    except Exception:
        errors.append(traceback.format_exc())
    results.put((writer, appended, dict(expected), errors))


def test_four_writers_never_see_database_is_locked(tmp_path: Path) -> None:
    location = str(tmp_path / "hammered.db")
    barrier, results = SPAWN.Barrier(WRITERS), SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_hammer, args=(location, w, barrier, results)) for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0

    errors = [e for _, _, _, errs in reports for e in errs]
    assert errors == [], "\n".join(errors[:3])

    ledger = DeliveryLedger.open(location)
    told: Counter[tuple[str, str]] = Counter(a for _, appended, _, _ in reports for a in appended)
    names = {"Recorded": "Recorded", "attempting": "Attempting", "failed": "Failed"}
    names["delivered"] = "Delivered"
    stored: Counter[tuple[str, str]] = Counter()
    for w in range(WRITERS):
        for i in range(OWN_PER_WRITER):
            oid = f"w{w}-{i:020d}"
            history = ledger.history(oid)
            assert [h.type for h in history] == [
                "Recorded",
                "Attempting",
                "Failed",
                "Attempting",
                "Delivered",
            ]
            stored.update((oid, h.type) for h in history)
    for oid in SHARED:
        history = ledger.history(oid)
        assert [h.version for h in history] == list(range(1, len(history) + 1))
        stored.update((oid, h.type) for h in history if h.type != "Recorded")
    assert sum(told.values()) == sum(stored.values())
    assert Counter({(o, names[t]): n for (o, t), n in told.items()}) == stored
    total = len(ledger.recorder.select_notifications(start=None, limit=100_000))
    assert total == WRITERS * OWN_PER_WRITER * 5 + sum(len(ledger.history(oid)) for oid in SHARED)
