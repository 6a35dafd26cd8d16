"""Operators' commands never harm a store (issue 14), through the real console script.

Each test runs ``gateway-ledger`` in a subprocess on real files: a command given the
wrong file changes nothing, a read-only copy is read without writing, a plain ``sweep``
spends no recovery attempt, and every failure is one line on stderr with exit code 2.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.values import LedgerPolicy
from tests.operator_support import owner, record

SCRIPT = str(Path(sys.executable).parent / "gateway-ledger")
AS_NOBODY = """
import importlib, os, pkgutil, sys
import gateway_ledger
from gateway_ledger.entrypoints import cli
cli.build_parser()  # every command module
for module in pkgutil.walk_packages(gateway_ledger.__path__, "gateway_ledger."):
    importlib.import_module(module.name)
import eventsourcing.sqlite, eventsourcing.postgres  # the stores, named at run time
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
sys.exit(cli.main(sys.argv[1:]))
"""
"""The console script's own ``main``, run as user ``nobody`` in a real child process. The
code is imported first, as root, then the process drops to nobody: what it reads from then
on (the store, its key) is read with nobody's rights, wherever this checkout lives (a
clone in a folder only root may enter, as CI's may be, would hide the script itself)."""

READ_COMMANDS = [
    ["status"],
    ["list"],
    ["history", "some-id"],
    ["audit", "duplicates"],
    ["projections", "status"],
    ["metrics"],
    ["sessions", "list"],
    ["sweep"],
]


def run(
    *args: str | bytes,
    env: dict[str, str] | None = None,
    as_nobody: bool = False,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ)
    environment.pop("GATEWAY_LEDGER_DB", None)
    environment.update(env or {})
    launcher = [sys.executable, "-c", AS_NOBODY] if as_nobody else [SCRIPT]
    command: list[str | bytes] = [*launcher, *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=environment, cwd=cwd
    )


def one_line_exit_2(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip("\n").splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def make_store(path: Path, *oids: str) -> Path:
    """A small ledger store whose obligations were left by a dead owner."""
    ledger = DeliveryLedger.open(path, owner=owner(4_200_001))
    for oid in oids:
        record(ledger, oid)
    ledger.stats()  # the views exist and are current
    ledger.close()
    return path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file in the folder: its bytes, mtime (ns) and mode."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode)
        for p in sorted(folder.iterdir())
    }


# -- files that are not a gateway-ledger store -------------------------------------------------


def other_apps_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        db.execute("INSERT INTO notes (body) VALUES ('mine, not yours')")
    db.close()


def other_apps_wal_sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE stored_events (originator_id, originator_version, topic, state)")
    db.execute("INSERT INTO stored_events VALUES ('x', 1, 'someone.else:Thing', x'00')")
    db.commit()
    db.close()


FOREIGN_FILES = {
    "other-sqlite": other_apps_sqlite,
    "other-wal-sqlite-with-stored-events": other_apps_wal_sqlite,
    "empty": lambda p: p.write_bytes(b""),
    "text": lambda p: p.write_text("just some notes\n"),
}


@pytest.mark.parametrize("kind", FOREIGN_FILES)
@pytest.mark.parametrize("command", [*READ_COMMANDS, ["sessions", "forget", "k"]], ids=" ".join)
def test_commands_leave_a_file_that_is_not_a_store_untouched(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir()
    target = folder / "app.db"
    FOREIGN_FILES[kind](target)
    before = snapshot(folder)
    done = run(*command, "--db", str(target))
    line = one_line_exit_2(done)
    assert "not a gateway-ledger store" in line
    assert snapshot(folder) == before  # not a byte, not an mtime, no new file


# -- read-only copies ------------------------------------------------------------------------


def read_only_copy_of(source: Path) -> Path:
    """The folder copied where user ``nobody`` may read but not write; the copy's master
    key belongs to nobody (0600), as an operator's own copy would."""
    outer = Path(tempfile.mkdtemp(prefix="gateway-ledger-ro-"))  # outside root's 0700 tmp
    outer.chmod(0o755)
    copy = outer / "copy"
    shutil.copytree(source, copy)
    for p in copy.iterdir():
        p.chmod(0o444)
    key = copy / "ledger.db.key"
    os.chown(key, 65534, 65534)
    key.chmod(0o600)
    copy.chmod(0o555)
    return copy / "ledger.db"


@pytest.fixture
def read_only_copy(tmp_path: Path) -> Iterator[Path]:
    """A read-only copy of a store with one event its views lack."""
    source = tmp_path / "source"
    source.mkdir()
    db = make_store(source / "ledger.db", "owed-1", "owed-2")
    ledger = DeliveryLedger.open(db, owner=owner(4_200_002))
    record(ledger, "owed-3")  # after the views' last catch-up: they lag by one event
    ledger.close()
    copy = read_only_copy_of(source)
    yield copy
    copy.parent.chmod(0o755)
    shutil.rmtree(copy.parent.parent)


def test_a_view_a_read_only_store_never_had_is_one_line_and_history_still_works(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    ledger = DeliveryLedger.open(source / "ledger.db", owner=owner(4_200_004))
    record(ledger, "owed-1")  # a gateway's store: no one ever ran status on it
    ledger.close()
    copy = read_only_copy_of(source)
    try:
        line = one_line_exit_2(run("status", "--db", str(copy), as_nobody=True, cwd=Path("/")))
        assert "never built" in line
        history = run("history", "owed-1", "--db", str(copy), as_nobody=True, cwd=Path("/"))
        assert history.returncode == 0, history.stderr
    finally:
        copy.parent.chmod(0o755)
        shutil.rmtree(copy.parent.parent)


def test_read_commands_work_on_a_read_only_copy_as_another_user(read_only_copy: Path) -> None:
    folder = read_only_copy.parent
    before = snapshot(folder)
    status = run("status", "--json", "--db", str(read_only_copy), as_nobody=True, cwd=folder)
    assert status.returncode == 0, status.stderr
    stats = json.loads(status.stdout)
    index = {p["name"]: p for p in stats["projections"]}["obligation_index"]
    assert index["lag"] >= 1  # reported, not caught up
    assert stats["total"] == 2  # what the view holds
    listed = run("list", "--json", "--db", str(read_only_copy), as_nobody=True, cwd=folder)
    assert listed.returncode == 0, listed.stderr
    history = run("history", "owed-3", "--json", "--db", str(read_only_copy), as_nobody=True)
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout)["history"][0]["type"] == "Recorded"
    for command in (["audit", "duplicates"], ["projections", "status"], ["sweep"], ["metrics"]):
        done = run(*command, "--db", str(read_only_copy), as_nobody=True, cwd=folder)
        assert done.returncode == 0, (command, done.stderr)
    assert snapshot(folder) == before


def test_a_write_command_on_a_read_only_copy_says_why_and_changes_nothing(
    read_only_copy: Path,
) -> None:
    folder = read_only_copy.parent
    before = snapshot(folder)
    done = run("status", "--json", "--db", str(read_only_copy), as_nobody=True)
    assert done.returncode == 0, done.stderr
    refused = run("retry", "owed-1", "--db", str(read_only_copy), as_nobody=True)
    assert "read-only" in one_line_exit_2(refused)
    assert snapshot(folder) == before


# -- sessions forget -------------------------------------------------------------------------


def test_forget_with_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    done = run("sessions", "forget", "agent:main:telegram:dm:42", "--db", str(missing))
    assert "no store at" in one_line_exit_2(done)
    assert list(tmp_path.iterdir()) == []


def test_forget_of_an_unknown_key_is_not_success(tmp_path: Path) -> None:
    db = make_store(tmp_path / "ledger.db", "owed-1")
    done = run("sessions", "forget", "agent:main:telegram:dm:nobody-here", "--db", str(db))
    assert "nothing" in one_line_exit_2(done)
    known = run("sessions", "forget", "agent:main:telegram:dm:42", "--db", str(db))
    assert known.returncode == 0, known.stderr
    assert "1 unresolved reply(ies) abandoned" in known.stdout


# -- sweep -----------------------------------------------------------------------------------


def _history(db: Path, oid: str) -> dict[str, Any]:
    done = run("history", oid, "--json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_plain_sweep_from_cron_never_spends_a_recovery_attempt(tmp_path: Path) -> None:
    db = make_store(tmp_path / "ledger.db", "never-sent")
    for _ in range(LedgerPolicy().max_attempts + 2):
        done = run("sweep", "--json", "--db", str(db))
        assert done.returncode == 0, done.stderr
        planned = {a["obligation_id"]: a["action"] for a in json.loads(done.stdout)["actions"]}
        assert planned == {"never-sent": "claim"}  # what a gateway's sweep would do
    history = _history(db, "never-sent")
    assert [e["type"] for e in history["history"]] == ["Recorded"]
    assert history["status"]["state"] == "pending"
    assert history["status"]["recovery_attempts"] == 0


def test_sweep_abandon_stale_abandons_only_what_is_stale(tmp_path: Path) -> None:
    db = make_store(tmp_path / "ledger.db", "fresh")
    long_ago = datetime.now(UTC) - LedgerPolicy().stale_after - timedelta(hours=1)
    old = DeliveryLedger.open(db, owner=owner(4_200_003), clock=lambda: long_ago)
    record(old, "stale")
    old.close()
    done = run("sweep", "--abandon-stale", "--json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["result"]["claimed"] == 0
    assert report["result"]["abandoned"] == {"stale": 1}
    assert _history(db, "stale")["status"]["abandon_reason"] == "stale"
    fresh = _history(db, "fresh")
    assert [e["type"] for e in fresh["history"]] == ["Recorded"]
    human = run("sweep", "--abandon-stale", "--db", str(db))
    assert human.returncode == 0 and "left for a gateway" in human.stdout


# -- every failure: exit 2, one line, no traceback -------------------------------------------


def _world_readable_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="gateway-ledger-cli-"))
    folder.chmod(0o755)
    return folder


def _store(tmp: Path) -> Path:
    return make_store(tmp / "ledger.db", "owed-1")


def _text(tmp: Path) -> Path:
    (tmp / "notes.db").write_text("not a database\n")
    return tmp / "notes.db"


def _empty(tmp: Path) -> Path:
    (tmp / "empty.db").write_bytes(b"")
    return tmp / "empty.db"


def _truncated(tmp: Path) -> Path:
    db = _store(tmp)
    with db.open("r+b") as f:
        f.truncate(4096)  # the header and schema page survive, the rest is gone
    return db


def _corrupt(tmp: Path) -> Path:
    db = _store(tmp)
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.seek(4096)
        f.write(b"\xa5" * (size - 4096))
    return db


def _unreadable(tmp: Path) -> Path:
    folder = _world_readable_dir()
    db = make_store(folder / "ledger.db", "owed-1")
    db.chmod(0o600)  # root's, and user nobody runs the command
    return db


def _binary_key(tmp: Path) -> Path:
    db = _store(tmp)
    Path(f"{db}.key").write_bytes(bytes(range(256)))
    return db


def _missing_key(tmp: Path) -> Path:
    db = _store(tmp)
    Path(f"{db}.key").unlink()
    return db


PG_DOWN = "postgresql://postgres@127.0.0.1:1/test"
PG_NO_DATABASE = "postgresql://postgres@127.0.0.1:5432/gateway_ledger_no_such_database"

# id: (store maker or URL or None for the store itself, arguments, extra environment, as nobody)
FAILURES: dict[str, tuple[Any, list[str | bytes], dict[str, str], bool]] = {
    "text-file": (_text, ["status"], {}, False),
    "empty-file": (_empty, ["list"], {}, False),
    "directory": (lambda tmp: tmp, ["status"], {}, False),
    "missing-store": (lambda tmp: tmp / "nope.db", ["metrics"], {}, False),
    "truncated-store": (_truncated, ["list"], {}, False),
    "corrupt-store": (_corrupt, ["history", "owed-1"], {}, False),
    "permission-denied": (_unreadable, ["status"], {}, True),
    "postgres-down": (PG_DOWN, ["status"], {}, False),
    "postgres-database-missing": (PG_NO_DATABASE, ["list"], {}, False),
    "postgres-bad-port": ("postgresql://postgres@127.0.0.1:port/test", ["status"], {}, False),
    "postgres-port-out-of-range": (
        "postgresql://postgres@127.0.0.1:99999/test",
        ["list"],
        {},
        False,
    ),
    "key-cache-ttl-not-a-number": (
        _store,
        ["history", "owed-1"],
        {"GATEWAY_LEDGER_KEY_CACHE_TTL": "abc"},
        False,
    ),
    "lease-ttl-not-a-number": (_store, ["status"], {"GATEWAY_LEDGER_LEASE_TTL": "soon"}, False),
    "since-out-of-range": (_store, ["list", "--since", "999999999999d"], {}, False),
    "at-out-of-range": (_store, ["history", "owed-1", "--at", "999999999999d"], {}, False),
    "argument-not-utf-8": (_store, ["history", b"owed-\xff\xfe"], {}, False),
    "bad-option-value": (_store, ["list", "--limit", "many"], {}, False),
    "binary-key-file": (_binary_key, ["history", "owed-1"], {}, False),
    "missing-key-file": (_missing_key, ["history", "owed-1"], {}, False),
    "forget-missing-store": (lambda tmp: tmp / "typo.db", ["sessions", "forget", "k"], {}, False),
}


@pytest.mark.parametrize("case", FAILURES)
def test_every_failure_is_exit_2_and_one_line(tmp_path: Path, case: str) -> None:
    maker, args, env, as_nobody = FAILURES[case]
    location = maker if isinstance(maker, str) else str(maker(tmp_path))
    try:
        done = run(*args, "--db", location, env=env, as_nobody=as_nobody, cwd=Path("/"))
        line = one_line_exit_2(done)
        assert line.startswith("gateway-ledger"), line
    finally:
        if not isinstance(maker, str) and location.startswith(tempfile.gettempdir() + "/gateway"):
            shutil.rmtree(Path(location).parent)


def test_a_postgres_schema_without_a_store_is_refused_and_not_created(pg_url: str) -> None:
    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    url = pg_url  # a fresh schema name, never created; its teardown drops it if it was
    params = parse_postgres_url(url)
    schema = params["schema"]
    for command in (["status"], ["list"], ["sessions", "list"], ["sessions", "forget", "k"]):
        line = one_line_exit_2(run(*command, "--db", url))
        assert "not a gateway-ledger store" in line
    with connect(params) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert found is None
