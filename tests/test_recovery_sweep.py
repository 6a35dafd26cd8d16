"""The sweep's decisions, with injected clocks and owners, on every store."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from recovery_support import dead_owner

from gateway_ledger.application.clock import Clock
from gateway_ledger.application.delivery.views import ObligationStatus
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.eventstore.bulk_events import load_aggregates
from gateway_ledger.infrastructure.ownership.liveness import LocalLiveness
from gateway_ledger.infrastructure.ownership.process_identity import (
    boot_id,
    current_owner,
    process_start_time,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(moment: datetime) -> Clock:
    return lambda: moment


def record(ledger: DeliveryLedger, oid: str, platform: str = "telegram") -> str:
    return ledger.record_obligation(
        obligation_id=oid,
        session_key=f"agent:main:{platform}:dm:1",
        platform=platform,
        chat_id="1",
        content=f"secret body of {oid}",
    )


def test_offline_platform_spends_nothing_then_delivers_once_back(store_location: str) -> None:
    record(
        DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0)), "slack-1", "slack"
    )
    for hour in range(1, 5):  # four boots while Slack is down
        gateway = DeliveryLedger.open(store_location, clock=at(T0 + timedelta(hours=hour)))
        assert gateway.sweep_recoverable(deliverable_platforms={"telegram"}) == []
        assert gateway.last_sweep is not None
        assert gateway.last_sweep.skipped_offline == 1
        assert gateway.last_sweep.abandoned == {}
        status = gateway.get("slack-1")
        assert (status.state, status.recovery_attempts, status.version) == ("pending", 0, 1)

    gateway = DeliveryLedger.open(store_location, clock=at(T0 + timedelta(hours=5)))
    (item,) = gateway.sweep_recoverable(deliverable_platforms={"telegram", "slack"})
    assert (item["obligation_id"], item["attempts"], item["needs_marker"]) == ("slack-1", 1, False)
    gateway.mark_delivered("slack-1", ["ts-1"])
    assert gateway.get("slack-1").state == "delivered"
    assert gateway.recoverable.catch_up() == 1
    assert gateway.recoverable.entries() == []
    assert gateway.sweep_recoverable() == []


def test_stale_cutoff_abandons_even_while_offline(store_location: str) -> None:
    record(DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0)), "old", "slack")
    gateway = DeliveryLedger.open(store_location)
    just_before = T0 + gateway.policy.stale_after - timedelta(seconds=1)
    assert gateway.sweep_recoverable(just_before, deliverable_platforms=()) == []
    assert gateway.get("old").state == "pending"
    assert (
        gateway.sweep_recoverable(T0 + gateway.policy.stale_after, deliverable_platforms=()) == []
    )
    assert gateway.last_sweep is not None and gateway.last_sweep.abandoned == {"stale": 1}
    status = gateway.get("old")
    assert (status.state, status.abandon_reason) == ("abandoned", "stale")
    assert gateway.recoverable.entries() == []


def test_claimers_that_keep_dying_reach_max_attempts_and_are_abandoned(
    store_location: str,
) -> None:
    record(DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0)), "cursed")
    markers = []
    for n in range(1, 4):  # three gateways claim it in turn and die before sending
        claimer = DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0))
        (item,) = claimer.sweep_recoverable()
        assert item["attempts"] == n
        markers.append(item["needs_marker"])
    assert markers == [False, True, True]  # once claimed, a send may have started

    gateway = DeliveryLedger.open(store_location, clock=at(T0 + timedelta(minutes=5)))
    assert gateway.sweep_recoverable(deliverable_platforms=()) == []  # even though offline
    assert gateway.last_sweep is not None and gateway.last_sweep.abandoned == {"max_attempts": 1}
    assert gateway.get("cursed").abandon_reason == "max_attempts"


def test_gateways_that_die_before_their_recovery_send_starts_never_exhaust_it(
    store_location: str,
) -> None:
    """ADR 0070: a gateway's sweep claims with ``records_send``; one killed while its
    claimed reply still waited for its turn spent nothing, however often that happens."""
    record(DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0)), "backlog")
    for _ in range(5):  # more than max_attempts gateways claim it and die before sending
        claimer = DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0))
        (item,) = claimer.sweep_recoverable(records_send=True)
        assert item["attempts"] == 1

    for n in (1, 2, 3):  # each of these claimers' sends starts, then it dies
        claimer = DeliveryLedger.open(store_location, owner=dead_owner(), clock=at(T0))
        (item,) = claimer.sweep_recoverable(records_send=True)  # claimable: not abandoned
        assert item["attempts"] == n
        assert claimer.last_sweep is not None and claimer.last_sweep.abandoned == {}
        obligation = claimer.load("backlog")
        obligation.start_recovery_send(by=claimer.owner, now=T0)
        claimer.save_transition(obligation, "recovery send started")

    last = DeliveryLedger.open(store_location, clock=at(T0 + timedelta(minutes=5)))
    assert last.sweep_recoverable(records_send=True) == []
    assert last.last_sweep is not None and last.last_sweep.abandoned == {"max_attempts": 1}
    status = last.get("backlog")
    assert (status.abandon_reason, status.recovery_attempts) == ("max_attempts", 3)


def test_failed_by_a_dead_owner_is_claimed_with_the_marker_its_history_implies(
    store_location: str,
) -> None:
    dead = DeliveryLedger.open(store_location, owner=dead_owner())
    for oid, classification in (("timed-out", "ambiguous"), ("refused", "rejected")):
        record(dead, oid)
        dead.mark_attempting(oid)
        dead.mark_failed(oid, "HTTP error", classification)
    won = {i["obligation_id"]: i for i in DeliveryLedger.open(store_location).sweep_recoverable()}
    assert won["timed-out"]["needs_marker"] is True
    assert won["refused"]["needs_marker"] is False


def test_live_own_delivered_and_abandoned_obligations_are_never_claimed(
    store_location: str,
) -> None:
    gateway = DeliveryLedger.open(store_location)
    record(gateway, "mine")
    elsewhere = OwnerIdentity(host="another-host", boot_id="b", pid=os.getpid(), start_time=1)
    # Held until the end: a ledger that is dropped closes, and a closed ledger releases its
    # lease, which would (rightly) make the other host's obligation claimable.
    other_host = DeliveryLedger.open(store_location, owner=elsewhere)
    record(other_host, "other-host")
    dead = DeliveryLedger.open(store_location, owner=dead_owner())
    for oid in ("done", "given-up"):
        record(dead, oid)
    dead.mark_attempting("done")
    dead.mark_delivered("done")
    dead.abandon("given-up", "operator", "the operator gave up")

    assert gateway.sweep_recoverable() == []
    result = gateway.last_sweep
    assert result is not None
    assert (result.candidates, result.skipped_own, result.skipped_alive) == (2, 1, 1)
    # The seam for leases: a policy that calls every owner dead takes the other host's
    # obligation, and still never our own.
    won = gateway.sweep_recoverable(liveness=lambda owner: False)
    assert [i["obligation_id"] for i in won] == ["other-host"]
    assert gateway.get("mine").state == "pending"
    assert gateway.get("done").state == "delivered"
    assert gateway.get("given-up").state == "abandoned"
    other_host.close()


def test_a_fresh_process_resumes_the_view_without_replaying_history(
    store_location: str,
) -> None:
    dead = DeliveryLedger.open(store_location, owner=dead_owner())
    for i in range(20):
        record(dead, f"done-{i}")
        dead.mark_attempting(f"done-{i}")
        dead.mark_delivered(f"done-{i}")
    record(dead, "left")
    first = DeliveryLedger.open(store_location)
    first.sweep_recoverable()
    assert first.last_sweep is not None and first.last_sweep.view_events_applied == 62
    position = first.recoverable.position()
    first.close()

    second = DeliveryLedger.open(store_location)
    assert second.recoverable.position() == position
    assert second.sweep_recoverable() == []
    assert second.last_sweep is not None
    assert second.last_sweep.view_events_applied == 0  # nothing replayed
    assert second.last_sweep.skipped_own == 1  # same process, same owner identity


def test_sweep_logs_ids_and_counts_never_bodies(
    store_location: str, caplog: pytest.LogCaptureFixture
) -> None:
    record(DeliveryLedger.open(store_location, owner=dead_owner()), "logged")
    gateway = DeliveryLedger.open(store_location)
    with caplog.at_level(logging.DEBUG, logger="gateway_ledger"):
        gateway.sweep_recoverable()
    text = caplog.text
    assert "claimed 1" in text and "logged" in text
    assert "secret body" not in text


def test_local_liveness_sees_reuse_reboot_and_unknown_start_times() -> None:
    host = socket.gethostname()
    me = current_owner()
    alive = LocalLiveness(host)
    assert alive(me)
    parent_pid = os.getppid()
    parent = OwnerIdentity(
        host=host, boot_id=boot_id(), pid=parent_pid, start_time=process_start_time(parent_pid)
    )
    assert alive(parent)
    reused = OwnerIdentity(host=host, boot_id=boot_id(), pid=parent_pid, start_time=1)
    unknown = OwnerIdentity(host=host, boot_id=boot_id(), pid=parent_pid, start_time=None)
    rebooted = OwnerIdentity(
        host=host, boot_id="another-boot", pid=me.pid, start_time=me.start_time
    )
    assert not alive(reused)  # the pid exists, but it is another process
    assert not alive(unknown)  # a live pid without a start time proves nothing
    assert not alive(rebooted)
    assert not alive(dead_owner())
    assert alive(OwnerIdentity(host="elsewhere", boot_id="x", pid=1, start_time=None))


def test_an_exited_owner_not_yet_reaped_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    host = socket.gethostname()
    started = process_start_time(child.pid)
    owner = OwnerIdentity(host=host, boot_id=boot_id(), pid=child.pid, start_time=started)
    alive = LocalLiveness(host)
    assert started is not None and alive(owner)
    assert child.stdin is not None
    child.stdin.close()  # it exits; nobody has waited for it yet: a zombie
    stat = Path(f"/proc/{child.pid}/stat")
    while b") Z " not in stat.read_bytes():
        time.sleep(0.01)
    assert not alive(owner)  # it will never send what it claimed
    child.wait()


def test_batched_reload_rebuilds_the_same_aggregates_as_the_repository(
    store_location: str,
) -> None:
    ledger = DeliveryLedger.open(store_location, owner=dead_owner())
    for oid in ("a", "b", "c"):
        record(ledger, oid)
    ledger.mark_attempting("b")
    ledger.mark_attempting("c")
    ledger.mark_failed("c", "timeout", "ambiguous")
    ids = [ledger.aggregate_id(oid) for oid in ("a", "b", "c", "never-recorded")]
    loaded = load_aggregates(ledger, ids)
    assert set(loaded) == set(ids[:3])
    for uuid_ in ids[:3]:
        expected = ObligationStatus.of(ledger.repository.get(uuid_))
        assert ObligationStatus.of(loaded[uuid_]) == expected
