"""Leases (ADR 0010): expiry with skew, renewal, release, pid death, installation ids."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from recovery_support import python_child

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.errors import InvalidInput
from gateway_ledger.domain.values import OwnerIdentity
from gateway_ledger.infrastructure.ownership.installation import resolve_installation_id
from gateway_ledger.infrastructure.ownership.leases import (
    Heartbeat,
    LeaseSettings,
    LeaseTable,
    owner_key,
)
from gateway_ledger.infrastructure.ownership.liveness import LeaseLiveness, LocalLiveness
from gateway_ledger.infrastructure.ownership.process_identity import current_owner

FOREIGN = OwnerIdentity(
    host="gw-far-away", boot_id="b-far", pid=4242, start_time=7, installation_id="inst-far"
)


class ManualClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def open_with_leases(location: str, **kwargs: object) -> DeliveryLedger:
    settings = LeaseSettings(ttl=30, renew_every=10, clock_skew=2, enabled=True)
    return DeliveryLedger.open(location, lease=settings, **kwargs)  # type: ignore[arg-type]


def test_a_foreign_lease_is_alive_until_expiry_plus_skew(store_location: str) -> None:
    ledger = open_with_leases(store_location)
    clock = ManualClock()
    table = LeaseTable.of(ledger, clock)
    liveness = LeaseLiveness(table, clock_skew=2.0)
    assert table.renew(FOREIGN, ttl=15) == clock.now + 15
    for offset, alive in [(0, True), (15, True), (16.9, True), (17.0, True), (17.01, False)]:
        clock.now = 1_000_000.0 + offset
        assert liveness(FOREIGN) is alive, offset
    table.renew(FOREIGN, ttl=15)  # a renewal brings it back: the row, not history, decides
    assert liveness(FOREIGN)
    assert LeaseLiveness(table, clock_skew=0.0)(FOREIGN)
    clock.now += 15.5
    assert not LeaseLiveness(table, clock_skew=0.0)(FOREIGN)
    assert LeaseLiveness(table, clock_skew=1.0)(FOREIGN)
    ledger.close()


def test_a_foreign_owner_without_a_lease_is_dead_a_local_one_is_judged_by_proc(
    store_location: str,
) -> None:
    ledger = open_with_leases(store_location)
    assert ledger.leases is not None
    liveness = LeaseLiveness(ledger.leases)
    assert not liveness(FOREIGN)  # released, pruned or never held: nobody vouches for it
    parent_pid = os.getppid()
    me = current_owner()
    assert liveness(me)  # has a lease (the ledger's own) and is running
    lease_less_local = OwnerIdentity(
        host=me.host, boot_id=me.boot_id, pid=parent_pid, start_time=None
    )
    assert not liveness(lease_less_local)  # no start time: cannot prove it is that process
    ledger.close()


def test_heartbeat_renews_well_inside_the_ttl_and_release_deletes_the_row(
    store_location: str,
) -> None:
    settings = LeaseSettings(ttl=1.0, renew_every=0.1, clock_skew=0.0, enabled=True)
    ledger = DeliveryLedger.open(store_location, lease=settings)
    assert ledger.heartbeat is not None and ledger.leases is not None
    heartbeat = ledger.heartbeat
    first = heartbeat.expires_at
    time.sleep(0.5)
    assert heartbeat.renewals >= 2 and heartbeat.failures == 0
    assert heartbeat.expires_at is not None and first is not None
    assert heartbeat.expires_at > first
    time.sleep(1.0)  # longer than the ttl: only renewals keep it alive
    other = LeaseLiveness(ledger.leases, clock_skew=0.0, host="another-host")
    assert other(ledger.owner)
    rows = ledger.leases.leases()
    assert [r.owner for r in rows] == [ledger.owner]
    ledger.close()
    assert not heartbeat.running
    # Held while its table is used: a dropped ledger closes its store under the table.
    reader = DeliveryLedger.open(store_location, lease=LeaseSettings(enabled=False))
    table = LeaseTable.of(reader)
    assert table.leases() == []
    assert not LeaseLiveness(table, host="another-host")(ledger.owner)
    reader.close()


def test_a_stopped_heartbeat_lets_the_lease_expire(store_location: str) -> None:
    settings = LeaseSettings(ttl=0.4, renew_every=0.1, clock_skew=0.1, enabled=True)
    ledger = DeliveryLedger.open(store_location, lease=settings)
    assert ledger.heartbeat is not None and ledger.leases is not None
    ledger.heartbeat.stop(release=False)  # as if the process were frozen
    remote = LeaseLiveness(ledger.leases, clock_skew=0.1, host="another-host")
    assert remote(ledger.owner)
    time.sleep(0.7)
    assert not remote(ledger.owner)
    assert not LeaseLiveness(ledger.leases, clock_skew=0.1)(ledger.owner)  # local, expired
    assert ledger.sweep_recoverable() == []  # nothing owed; the sweep runs with leases


def test_a_local_owner_whose_process_died_is_dead_before_its_lease_expires(
    store_location: str,
) -> None:
    child = python_child(
        f"""
        import time
        from gateway_ledger.bootstrap import DeliveryLedger
        from gateway_ledger.infrastructure.ownership.leases import LeaseSettings
        ledger = DeliveryLedger.open({store_location!r},
                                     lease=LeaseSettings(ttl=600, renew_every=60, enabled=True))
        ledger.record_obligation(obligation_id="mine", session_key="agent:main:x:dm:1",
                                 platform="telegram", chat_id="1", content="working on it")
        ledger.mark_attempting("mine")
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready", child.stderr
    ledger = open_with_leases(store_location)
    assert ledger.leases is not None
    owner = ledger.get("mine").owner
    lookup = ledger.leases.lookup(owner)
    assert lookup.expires_at is not None and not lookup.expired(0)  # ten minutes to go
    assert ledger.sweep_recoverable() == []
    assert ledger.last_sweep is not None and ledger.last_sweep.skipped_alive == 1
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    started = time.monotonic()
    (won,) = ledger.sweep_recoverable()
    assert won["obligation_id"] == "mine" and won["needs_marker"] is True
    assert time.monotonic() - started < 5  # no waiting for the ten-minute lease
    assert not ledger.leases.lookup(owner).expired(0)
    ledger.close()


def test_leases_default_on_for_postgres_off_for_sqlite(store_location: str, backend: str) -> None:
    ledger = DeliveryLedger.open(store_location)
    if backend == "postgres":
        assert ledger.heartbeat is not None and isinstance(ledger.liveness, LeaseLiveness)
    else:
        assert ledger.heartbeat is None and isinstance(ledger.liveness, LocalLiveness)
    ledger.close()


def test_lease_settings_validate_and_read_the_environment() -> None:
    with pytest.raises(InvalidInput, match="inside its ttl"):
        LeaseSettings(ttl=5, renew_every=5)
    with pytest.raises(InvalidInput, match="positive"):
        LeaseSettings(ttl=0)
    with pytest.raises(InvalidInput, match="clock_skew"):
        LeaseSettings(clock_skew=-1)
    env = {
        "GATEWAY_LEDGER_LEASE_TTL": "2",
        "GATEWAY_LEDGER_CLOCK_SKEW": "0.5",
        "GATEWAY_LEDGER_LEASES": "on",
    }
    settings = LeaseSettings.from_env(env)
    assert (settings.ttl, settings.clock_skew, settings.enabled) == (2.0, 0.5, True)
    assert settings.renew_every < settings.ttl / 2  # renewed well inside the ttl
    assert settings.dead_after == 2.5
    assert LeaseSettings.from_env({}).enabled is None
    with pytest.raises(InvalidInput, match="GATEWAY_LEDGER_LEASE_TTL"):
        LeaseSettings.from_env({"GATEWAY_LEDGER_LEASE_TTL": "soon"})


def test_a_failed_renewal_is_counted_and_logged_not_raised(
    store_location: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = open_with_leases(store_location)
    broken = {"now": False}

    def clock() -> float:
        if broken["now"]:
            raise OSError("store unreachable")
        return time.time()

    table = LeaseTable.of(ledger, clock)
    heartbeat = Heartbeat(table, FOREIGN, LeaseSettings(ttl=1, renew_every=0.5)).start()
    heartbeat.stop(release=False)
    broken["now"] = True
    with caplog.at_level("WARNING", logger="gateway_ledger.leases"):
        assert heartbeat.beat() is False
    assert heartbeat.failures == 1 and "lease renewal failed" in caplog.text
    broken["now"] = False
    assert heartbeat.beat() is True and heartbeat.renewals == 1
    ledger.close()


def test_owner_key_distinguishes_a_reused_pid() -> None:
    reused = OwnerIdentity(
        host=FOREIGN.host,
        boot_id=FOREIGN.boot_id,
        pid=FOREIGN.pid,
        start_time=8,
        installation_id=FOREIGN.installation_id,
    )
    assert owner_key(reused) != owner_key(FOREIGN)


def test_installation_id_is_configured_or_persisted_next_to_the_store(tmp_path: Path) -> None:
    db = str(tmp_path / "ledger.db")
    assert resolve_installation_id(db, {"GATEWAY_LEDGER_INSTALLATION_ID": "inst-7"}) == "inst-7"
    first = resolve_installation_id(db, {})
    assert Path(f"{db}.installation-id").read_text().strip() == first
    assert resolve_installation_id(db, {}) == first  # stable across restarts
    other = str(tmp_path / "other.db")
    assert resolve_installation_id(other, {}) != first
    state = tmp_path / "state"
    pg_id = resolve_installation_id(None, {"XDG_STATE_HOME": str(state)})
    assert (state / "gateway-ledger" / "installation-id").read_text().strip() == pg_id
    results: list[str] = []
    racers = [
        threading.Thread(
            target=lambda: results.append(resolve_installation_id(str(tmp_path / "race.db"), {}))
        )
        for _ in range(8)
    ]
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    assert len(set(results)) == 1  # concurrent first starts agree


def test_a_ledger_takes_host_and_installation_from_the_environment(
    store_location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_LEDGER_HOST", "posing-host-b")
    monkeypatch.setenv("GATEWAY_LEDGER_INSTALLATION_ID", "inst-b")
    ledger = DeliveryLedger.open(store_location)
    assert (ledger.owner.host, ledger.owner.installation_id) == ("posing-host-b", "inst-b")
    assert ledger.owner.pid == os.getpid()
    ledger.close()


def test_a_holder_proves_its_lease_by_a_local_monotonic_deadline_and_counts_lapses(
    sqlite_location: str,
) -> None:
    """ADR 0032: the deadline is the clock read BEFORE a renewal that landed, plus the ttl;
    a process stopped past it finds on resuming that it cannot prove its lease, before any
    renewal; a renewal that lands after it counts a lapse (others may have claimed)."""
    ledger = open_with_leases(sqlite_location)
    mono = ManualClock(100.0)
    slow = {"renewal": 0.0, "fail": False}

    def store_clock() -> float:  # the table reads its clock inside each renewal
        if slow["fail"]:
            raise OSError("store unreachable")
        mono.now += slow["renewal"]
        return time.time()

    table = LeaseTable.of(ledger, store_clock)
    heartbeat = Heartbeat(table, FOREIGN, LeaseSettings(ttl=2, renew_every=0.5), monotonic=mono)
    assert not heartbeat.holds()  # nothing acquired yet
    heartbeat.renew()
    assert heartbeat.lapses == 1  # the first acquisition: nothing proven before it
    assert heartbeat.holds(1.9) and not heartbeat.holds(2.0)
    mono.now = 101.5
    assert heartbeat.beat() and heartbeat.lapses == 1  # on time: continuity proven
    assert heartbeat.holds(1.9) and not heartbeat.holds(2.0)  # 101.5 + 2

    mono.now = 110.0  # stopped (SIGSTOP) well past the deadline; no renewal has run yet
    assert not heartbeat.holds()
    assert heartbeat.beat() and heartbeat.lapses == 2 and heartbeat.holds(1.9)

    slow["renewal"] = 1.5  # started inside the deadline (111 < 112), landed after it
    mono.now = 111.0
    assert heartbeat.beat() and heartbeat.lapses == 3
    assert mono.now == 112.5
    assert heartbeat.holds(0.4) and not heartbeat.holds(0.5)  # from its start: 111 + 2

    slow["renewal"], slow["fail"] = 0.0, True
    mono.now = 112.9
    assert heartbeat.beat() is False  # a failed renewal moves nothing
    assert not heartbeat.holds(0.1) and heartbeat.lapses == 3
    ledger.close()
