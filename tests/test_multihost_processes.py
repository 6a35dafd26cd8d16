"""Several gateway processes posing as several hosts on one PostgreSQL schema (ADR 0010).

Real processes, real signals: SIGKILL mid-send, SIGSTOP past the lease then SIGCONT.
Each process has its own GATEWAY_LEDGER_HOST and GATEWAY_LEDGER_INSTALLATION_ID, so none
can judge another through /proc: only leases (ttl 1 s here) and fences decide.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gateway_ledger.application.delivery.ports import DUPLICATE_NOTICE
from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.ownership.leases import LeaseSettings
from gateway_ledger.infrastructure.ownership.liveness import LeaseLiveness

CHILD = str(Path(__file__).with_name("multihost_child.py"))
TTL, SKEW = 1.0, 0.2


def host(name: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        {
            "GATEWAY_LEDGER_HOST": f"host-{name}",
            "GATEWAY_LEDGER_INSTALLATION_ID": f"inst-{name}",
            "GATEWAY_LEDGER_LEASE_TTL": str(TTL),
            "GATEWAY_LEDGER_LEASE_RENEW": "0.2",
            "GATEWAY_LEDGER_CLOCK_SKEW": str(SKEW),
        }
    )
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def expect(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdout is not None
    got = child.stdout.readline().strip()
    if got != line:
        child.kill()
        raise AssertionError(f"expected {line!r}, got {got!r}; stderr: {child.stderr.read()}")  # type: ignore[union-attr]


def tell(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdin is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()


def observer(url: str) -> DeliveryLedger:
    """The test's own gateway-less ledger, on this (real) host, with the children's skew."""
    return DeliveryLedger.open(url, lease=LeaseSettings(ttl=TTL, renew_every=0.2, clock_skew=SKEW))


def test_a_killed_host_is_recovered_by_two_others_each_obligation_exactly_once(
    pg_url: str,
) -> None:
    count = 20
    victim = host("a", "victim", pg_url, str(count))
    survivors = [host(name, "survivor", pg_url) for name in ("b", "c")]
    try:
        for s in survivors:
            expect(s, "ready")
        expect_sending(victim, count)
        expect(victim, "ready")
        ledger = observer(pg_url)
        ledger.recoverable.catch_up()
        owed = [e for e in ledger.recoverable.entries() if e.owner.host == "host-a"]
        assert len(owed) == count and {e.state for e in owed} == {"attempting"}
        victim_owner = owed[0].owner
        assert victim_owner.installation_id == "inst-a"

        victim.send_signal(signal.SIGKILL)  # mid-send: 20 sends on their way, none confirmed
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert ledger.leases is not None
        remote = LeaseLiveness(ledger.leases, clock_skew=SKEW)
        assert remote(victim_owner)  # its lease still runs: nobody may take its work yet
        deadline = time.monotonic() + 10
        while remote(victim_owner):
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.05)

        for s in survivors:  # both sweep at once
            tell(s, "go")
        reports = []
        for s in survivors:
            out, err = s.communicate(timeout=60)
            assert s.returncode == 0, err
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in (victim, *survivors):
            if p.poll() is None:
                p.kill()
                p.wait()

    ids = {e.obligation_id for e in owed}
    sent = [oid for r in reports for oid, _ in r["sent"]]
    assert Counter(sent) == Counter(ids)  # each re-sent exactly once, by one survivor
    assert sum(r["claimed"] for r in reports) == count
    assert sum(r["redelivered"] for r in reports) == count
    for r in reports:
        assert all(text.startswith(DUPLICATE_NOTICE) for _, text in r["sent"])  # the marker
    by_host = {oid: r["host"] for r in reports for oid, _ in r["sent"]}
    for oid in ids:
        history = ledger.history(oid)
        assert [h.type for h in history] == [
            "Recorded",
            "Attempting",
            "Claimed",
            "RecoverySendStarted",  # the claimer's send starts: the claim is spent (ADR 0070)
            "Delivered",
        ]
        claim = history[2].fields
        assert claim["previous_owner"] == victim_owner and claim["needs_marker"] is True
        assert claim["by"].host == by_host[oid] and claim["fence"] == 1
    assert ledger.recoverable.entries() == [] or all(
        e.owner.host != "host-a" for e in ledger.recoverable.entries()
    )
    ledger.close()


def expect_sending(child: subprocess.Popen[str], count: int) -> None:
    assert child.stdout is not None
    for _ in range(count):
        line = child.stdout.readline().strip()
        assert line.startswith("sending "), (line, child.stderr)


def test_a_paused_owner_cannot_send_after_a_claim_and_its_late_delivery_is_flagged(
    pg_url: str,
) -> None:
    paused = host("p", "paused", pg_url)
    try:
        assert paused.stdout is not None
        first = paused.stdout.readline().split()  # the send that fails (retry in 3 s)
        second = paused.stdout.readline().split()  # the send we freeze inside
        assert first[0] == second[0] == "sending"
        paused.send_signal(signal.SIGSTOP)
        failed_oid, frozen_oid = first[1], second[1]

        ledger = observer(pg_url)
        time.sleep(TTL + SKEW + 0.3)  # its lease runs out while it is stopped
        won = {w["obligation_id"]: w for w in ledger.sweep_recoverable()}
        assert set(won) == {failed_oid, frozen_oid}
        assert won[frozen_oid]["needs_marker"] is True
        ledger.mark_delivered(frozen_oid, ["claimer-msg"])
        ledger.mark_delivered(failed_oid, ["claimer-msg-2"])

        paused.send_signal(signal.SIGCONT)
        tell(paused, "report")
        out, err = paused.communicate(timeout=30)
        assert paused.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
    finally:
        if paused.poll() is None:
            paused.send_signal(signal.SIGCONT)
            paused.kill()
            paused.wait()

    # It sent each reply once before it was stopped, and nothing after: the retry due
    # during the pause found itself fenced out.
    assert [oid for oid, _ in report["sent"]] == [failed_oid, frozen_oid]
    assert report["second"] == "delivered" and report["late_results"] == 1
    retried = [h.type for h in ledger.history(failed_oid)]
    assert retried == ["Recorded", "Attempting", "Failed", "Claimed", "Delivered"]
    history = ledger.history(frozen_oid)
    assert [h.type for h in history] == [
        "Recorded",
        "Attempting",
        "Claimed",
        "Delivered",
        "LateResultReported",
    ]
    late = history[-1].fields
    assert late["late"] is True and late["outcome"] == "delivered"
    assert late["by"].host == "host-p" and late["receipt"] == [f"{frozen_oid}-msg"]
    assert (late["fence"], late["current_fence"]) == (0, 1)
    status = ledger.get(frozen_oid)
    assert (status.state, status.receipt) == ("delivered", ("claimer-msg",))
    ledger.close()
