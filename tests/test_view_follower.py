"""The view follower keeps projections current as events land: NOTIFY on PostgreSQL,
polling on SQLite, through the library API and the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url
from gateway_ledger.infrastructure.views.follower import ViewFollower
from gateway_ledger.infrastructure.wakeups import PostgresNotifications

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")


def record(ledger: DeliveryLedger, count: int) -> list[str]:
    ids = []
    for i in range(count):
        oid = uuid.uuid4().hex[:24]
        ledger.record_obligation(
            obligation_id=oid,
            session_key=f"agent:main:telegram:dm:{i}",
            platform="telegram",
            chat_id=str(i),
            thread_id=None,
            content=f"reply {i}",
        )
        ids.append(oid)
    return ids


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> float:
    """Seconds until ``check()`` held; fails the test after ``seconds``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < seconds, "not within the time allowed"
        time.sleep(0.01)
    return time.monotonic() - started


@contextmanager
def following(ledger: DeliveryLedger, interval: float) -> Iterator[ViewFollower]:
    follower = ViewFollower(ledger, interval=interval).start()
    try:
        yield follower
    finally:
        follower.stop()


def test_views_follow_new_events_without_any_read(store_location: str, backend: str) -> None:
    writer = DeliveryLedger.open(store_location)
    reader = DeliveryLedger.open(store_location)
    try:
        before = record(writer, 3)  # written before the follower listened: caught up too
        # On PostgreSQL only a NOTIFY can explain a catch-up within the test's time.
        interval = 60.0 if backend == "postgres" else 0.05
        with following(reader, interval) as follower:
            newest = writer.recorder.max_notification_id()
            eventually(lambda: follower.stats.position == newest)
            after = record(writer, 4)
            newest = writer.recorder.max_notification_id()
            eventually(lambda: follower.stats.position == newest)
            if backend == "postgres":
                assert follower.stats.notified >= 1
            assert follower.stats.errors == 0
            assert follower.stats.applied == {
                "recoverable_obligations": 7,
                "obligation_index": 7,
            }
        # What the follower applied is the views' own state: an operator's read finds it.
        rows = {row.obligation_id for row in reader.list(limit=50)}
        assert rows == set(before + after)
        for view in follower.views:
            assert view.runner.position() == newest
            assert view.catch_up() == 0
    finally:
        writer.close()
        reader.close()


def test_a_killed_listen_connection_is_renewed_and_nothing_is_missed(pg_url: str) -> None:
    writer = DeliveryLedger.open(pg_url)
    reader = DeliveryLedger.open(pg_url)
    try:
        with following(reader, 60.0) as follower:
            wakeups = follower.wakeups
            assert isinstance(wakeups, PostgresNotifications)
            eventually(lambda: wakeups._conn is not None)
            pid = wakeups._conn.info.backend_pid
            with connect(parse_postgres_url(pg_url)) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            record(writer, 2)  # may commit while nobody listens
            newest = writer.recorder.max_notification_id()
            eventually(lambda: follower.stats.position == newest)
            eventually(lambda: wakeups._conn is not None)  # the LISTEN is renewed
            assert wakeups.reconnects == 1
            assert wakeups._conn.info.backend_pid != pid
            record(writer, 2)  # and the renewed LISTEN hears the next ones
            newest = writer.recorder.max_notification_id()
            eventually(lambda: follower.stats.position == newest)
            assert follower.stats.applied["recoverable_obligations"] == 4
    finally:
        writer.close()
        reader.close()


def test_notifications_on_one_schema_cost_other_schemas_nothing(pg_url: str) -> None:
    """The library's channel is named after the table, not the schema: a follower of
    another schema is woken too, and its catch-up finds nothing to apply."""
    other = pg_url.replace("schema=", "schema=other_")
    writer = DeliveryLedger.open(pg_url)
    bystander = DeliveryLedger.open(other)
    try:
        with following(bystander, 60.0) as follower:
            eventually(lambda: follower.stats.catch_ups >= 2)  # listening
            woken = follower.stats.notified
            record(writer, 1)
            eventually(lambda: follower.stats.notified > woken)
            assert sum(follower.stats.applied.values()) == 0
            assert follower.stats.errors == 0
    finally:
        writer.close()
        bystander.close()
        with connect(parse_postgres_url(other)) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    psycopg.sql.Identifier(parse_postgres_url(other)["schema"])
                )
            )


def cli_env(location: str) -> dict[str, str]:
    env = dict(os.environ)
    env["GATEWAY_LEDGER_DB"] = location
    return env


def follow(location: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``gateway-ledger projections follow ARGS`` on ``location``, run to its end."""
    return subprocess.run(
        [SCRIPT, "projections", "follow", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(location),
    )


def test_the_console_script_follows_and_stops_on_sigterm(store_location: str) -> None:
    writer = DeliveryLedger.open(store_location)
    try:
        record(writer, 1)  # the store exists before the operator starts following
        proc = subprocess.Popen(
            [SCRIPT, "projections", "follow", "--interval", "0.1", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(store_location),
        )
        try:
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())  # the catch-up of what was there
            assert first["applied"] == {"recoverable_obligations": 1, "obligation_index": 1}
            record(writer, 2)
            seen = {"recoverable_obligations": 0, "obligation_index": 0}
            while seen["recoverable_obligations"] < 2:  # in one catch-up or two
                line = json.loads(proc.stdout.readline())
                for name, count in line["applied"].items():
                    seen[name] += count
            assert seen == {"recoverable_obligations": 2, "obligation_index": 2}
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["stopped"] is True
        assert summary["applied"] == {"recoverable_obligations": 3, "obligation_index": 3}
        assert summary["errors"] == 0
        assert summary["position"] == writer.recorder.max_notification_id()
        assert "reply " not in out + err  # counts and ids only, never message text
    finally:
        writer.close()


def test_the_console_script_runs_for_a_set_time_and_refuses_a_bad_interval(
    sqlite_location: str,
) -> None:
    writer = DeliveryLedger.open(sqlite_location)
    record(writer, 2)
    writer.close()
    started = time.monotonic()
    done = follow(sqlite_location, "--for", "0.5")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    lines = done.stdout.strip().splitlines()
    assert "applied recoverable_obligations 2, obligation_index 2" in lines[0]
    assert lines[-1].startswith("stopped: ")
    assert "4 events applied, 0 errors" in lines[-1]
    bad = follow(sqlite_location, "--interval", "0")
    assert bad.returncode == 2
    assert "interval must be positive, not 0.0" in bad.stderr
