"""What the golden-store generator and the golden-store test share (tests/golden/README.md).

One place for: the file names of a release folder, the environment the console script
runs in, the commands whose answers are frozen, the one normalising function, the export
of an SQLite store's rows and their load into a fresh PostgreSQL schema.
"""

from __future__ import annotations

import base64
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson

REPO = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO / "tests" / "golden"

MAIN_STORE = "store.db"  # the ledger and the keyed session store, in one file
RAW_STORE = "raw-keys.db"  # a session store made with raw_keys=True (a store has one mode);
# it holds no obligation, so only the session commands are asked of it
STORES = (MAIN_STORE, RAW_STORE)
MASTER_KEY_FILE = "master.key"  # the test master key both stores were sealed with
SESSION_SECRET_FILE = "session-secret"  # the keyed session store's secret
KEYS_FILE = "session-keys.json"  # the session keys each store holds, for `sessions show`
ANSWERS_FILE = "answers.json"

GOLDEN_HOST = "golden-host"
"""Every owner in a golden store runs on this host, in a boot no machine has: the console
script runs with GATEWAY_LEDGER_HOST set to it, so every owner is local and provably dead
on both stores (/proc on SQLite, leases on PostgreSQL), whatever machine runs the test."""

NEWER_TOPIC = "gateway_ledger.domain.obligation:DeliveryObligation.Snoozed"
"""An event type a later release might add; the releases so far do not know it."""

VARIES = "<varies>"


def rows_file(store: str) -> str:
    return f"{store}.rows.jsonl"


# -- the console script ------------------------------------------------------------------------


def console_script() -> str:
    return str(Path(sys.executable).parent / "gateway-ledger")


def place_key_files(folder: Path, directory: Path) -> None:
    """Copy the committed key and secret beside the SQLite stores in ``directory``, 0600
    (git keeps no modes, and the key-file rule refuses anything else)."""
    for store in STORES:
        names = [(MASTER_KEY_FILE, f"{store}.key")]
        if store == MAIN_STORE:
            names.append((SESSION_SECRET_FILE, f"{store}.session-secret"))
        for source, name in names:
            target = directory / name
            if target.exists() and target.samefile(folder / source):
                continue
            shutil.copyfile(folder / source, target)
            target.chmod(0o600)


def command_environment(secret_dir: Path | None = None) -> dict[str, str]:
    """The environment of every golden command: no key in it (the files beside an SQLite
    store are used, or ``secret_dir`` for PostgreSQL), the golden host, no user settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_LEDGER_") or k == "GATEWAY_LEDGER_TEST_POSTGRES"
    }
    env["GATEWAY_LEDGER_HOST"] = GOLDEN_HOST
    env["GATEWAY_LEDGER_INSTALLATION_ID"] = "golden-reader"
    env["TZ"] = "UTC"
    if secret_dir is not None:
        env["GATEWAY_LEDGER_SECRET_DIR"] = str(secret_dir)
        env["GATEWAY_LEDGER_KEY_DIR"] = str(secret_dir)
    return env


@contextmanager
def golden_environment(folder: Path) -> Iterator[None]:
    """This process's environment while the generator writes (as ``command_environment``)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(command_environment())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(location: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One console command with --json: its exit code and its document (or its one line)."""
    done = subprocess.run(
        [console_script(), *args, "--db", location, "--json"],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    answer: dict[str, Any] = {"exit": done.returncode}
    try:
        answer["json"] = orjson.loads(done.stdout)
    except orjson.JSONDecodeError:
        answer["stdout"] = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        answer["stderr"] = done.stderr.decode(errors="replace").strip()
    return answer


def answers_for(
    location: str, session_keys: list[str], env: dict[str, str], *, ledger: bool = True
) -> dict[str, Any]:
    """The frozen questions, in this order: the sweep preview and status first, as they
    catch the views up (from where the stored views were: the SQLite file keeps the views
    its release left, a PostgreSQL load starts them empty)."""
    out: dict[str, Any] = {}
    questions: dict[tuple[str, ...], list[str]] = {("sessions list",): ["sessions", "list"]}
    ids: list[str] = []
    if ledger:
        out["sweep"] = run(location, ["sweep"], env)
        out["status"] = run(location, ["status"], env)
        out["list"] = run(location, ["list", "--limit", "100000"], env)
        ids = sorted(r["obligation_id"] for r in out["list"].get("json", {}).get("obligations", []))
        questions[("audit duplicates",)] = ["audit", "duplicates"]
    # The views are caught up: the readers in between run side by side (seconds matter).
    questions = {
        **questions,
        **{("history", oid): ["history", oid] for oid in ids},
        **{("sessions show", key): ["sessions", "show", key] for key in session_keys},
    }
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run, location, args, env) for name, args in questions.items()}
    out["history"], out["sessions show"] = {}, {}
    for name, future in futures.items():
        if len(name) == 1:
            out[name[0]] = future.result()
        else:
            out[name[0]][name[1]] = future.result()
    if ledger:
        out["projections rebuild"] = run(location, ["projections", "rebuild"], env)
    normalised: dict[str, Any] = normalise(out, location)
    return normalised


def take_answers(
    folder: Path, scratch: Path, *, backend: str, pg_url: str | None = None
) -> dict[str, Any]:
    """Every store of a release folder, copied to ``scratch`` (SQLite) or loaded into
    schemas derived from ``pg_url`` (PostgreSQL), asked the frozen questions."""
    scratch.mkdir(parents=True, exist_ok=True)
    keys = orjson.loads((folder / KEYS_FILE).read_bytes())
    answers: dict[str, Any] = {}
    if backend == "sqlite":
        for store in STORES:
            shutil.copyfile(folder / store, scratch / store)
            (scratch / store).chmod(0o600)
        place_key_files(folder, scratch)
        env = command_environment()
        for store in STORES:
            answers[store] = answers_for(
                str(scratch / store), keys[store], env, ledger=store == MAIN_STORE
            )
        return answers
    assert pg_url is not None
    secrets = postgres_secrets(folder, scratch)
    env = command_environment(secrets)
    for store in STORES:
        url = schema_url(pg_url, store)
        place(folder / SESSION_SECRET_FILE, postgres_secret(secrets, url))
        answers[store] = answers_for(url, keys[store], env, ledger=store == MAIN_STORE)
    return answers


def postgres_secrets(folder: Path, scratch: Path) -> Path:
    """A directory with the folder's master key, for GATEWAY_LEDGER_KEY_DIR and
    GATEWAY_LEDGER_SECRET_DIR (PostgreSQL has no file beside the store)."""
    secrets = scratch / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    place(folder / MASTER_KEY_FILE, secrets / "master.key")
    return secrets


def place(source: Path, target: Path) -> None:
    shutil.copyfile(source, target)
    target.chmod(0o600)


def postgres_secret(directory: Path, url: str) -> Path:
    """Where a PostgreSQL session store looks for its secret (named after the schema)."""
    from gateway_ledger.infrastructure.sessions.secrets import secret_path

    return secret_path(url, directory)


def schema_url(pg_url: str, store: str) -> str:
    """One schema per golden store: the test's schema for the main one, a sibling for the
    raw-keys one (a store holds one keying mode)."""
    return pg_url if store == MAIN_STORE else pg_url + "_raw"


# -- the one normalising function --------------------------------------------------------------

# Wall-clock figures: how long a command took, how old something is now.
_TIMING_KEYS = frozenset({"elapsed_seconds", "elapsed_ms", "generated_at"})
_AGE_KEYS = frozenset(
    {"oldest_unresolved_age_seconds", "oldest_unresolved_age", "age_seconds", "oldest_age_seconds"}
)
# Positions in the notification log: on SQLite the ledger and the session store share one
# events table (the library's), on PostgreSQL each has its own, so the same events sit at
# other positions, and a scan of the log (the audit's events_scanned) meets the other
# application's events too. How far a view had to catch up (view_events_applied) depends on
# where the stored view stood: the SQLite file keeps its release's views, a PostgreSQL load
# starts them empty. Counts of what is stored (rows, obligations, findings) never differ.
_POSITION_KEYS = frozenset(
    {"position", "lag", "log_position", "view_events_applied", "events_scanned"}
)


def normalise(value: Any, location: str = "") -> Any:
    """The answers with what legitimately varies replaced by ``<varies>``: elapsed and
    age seconds (the wall clock), notification-log positions (one table on SQLite, one per
    application on PostgreSQL), and the store's location (a tmp path or a schema)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in _TIMING_KEYS or key in _AGE_KEYS or key in _POSITION_KEYS:
                out[key] = VARIES if item is not None else None
            else:
                out[key] = normalise(item, location)
        return out
    if isinstance(value, list):
        return [normalise(item, location) for item in value]
    if isinstance(value, str) and location and location in value:
        return value.replace(location, "<store>")
    return value


# -- rows: export from SQLite, load into PostgreSQL -------------------------------------------

_SQLITE_EVENTS = "stored_events"
_SQLITE_SNAPSHOTS = "stored_snapshots"
_ROWID_TABLES = frozenset({_SQLITE_EVENTS, "gateway_ledger_privacy_meta"})


def _sessions_topic(topic: str) -> bool:
    return topic.startswith(
        ("gateway_ledger.domain.session:", "gateway_ledger.domain.session_route:")
    )


def _encode(value: Any) -> Any:
    if isinstance(value, bytes | memoryview):
        return {"b64": base64.b64encode(bytes(value)).decode()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value


def stored_tables(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    finally:
        conn.close()


def export_rows(db: Path, out: Path) -> None:
    """Every row of the tables that hold what was written (events, snapshots, data keys,
    privacy records), in insertion order, one JSON object a line with bytes as base64.
    Views and their tracking rows are not exported: they are rebuilt from the events."""
    conn = sqlite3.connect(db)
    lines: list[bytes] = []
    try:
        for table in stored_tables(db):
            if not is_stored_truth(table):
                continue
            order = "rowid" if table in _ROWID_TABLES else "1, 2"
            cur = conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}')
            columns = [d[0] for d in cur.description]
            for row in cur:
                record = {c: _encode(v) for c, v in zip(columns, row, strict=True)}
                lines.append(orjson.dumps({"table": table, "row": record}))
    finally:
        conn.close()
    out.write_bytes(b"\n".join(lines) + b"\n")


def is_stored_truth(table: str) -> bool:
    """The tables the truth lives in (not views, trackings, leases or SQLite's own)."""
    return (
        table in (_SQLITE_EVENTS, _SQLITE_SNAPSHOTS)
        or table.startswith("gateway_ledger_subject_keys")
        or table.startswith("gateway_ledger_privacy")
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# -- the planted faults (SQLite, generator only) -----------------------------------------------


def planted(db: Path) -> Any:
    """The store's events table, for the faults the generator plants with plain SQL (the
    simulator's own fault planter: one way to write bad bytes)."""
    from gateway_ledger.entrypoints.simulation.faults import EventTable

    return EventTable(str(db), _SQLITE_EVENTS)


# -- coverage ---------------------------------------------------------------------------------


def release_topics() -> list[str]:
    """Every event class of this release's aggregates, as stored topics."""
    from eventsourcing.domain import Aggregate, CanMutateAggregate
    from eventsourcing.utils import get_topic

    from gateway_ledger.domain.delivery.obligation import DeliveryObligation
    from gateway_ledger.domain.privacy.erasure import Erasure
    from gateway_ledger.domain.sessions.route import InboundMessage, SessionKeying, SessionRoute
    from gateway_ledger.domain.sessions.session import Session

    topics: set[str] = set()
    for aggregate in (
        DeliveryObligation,
        Session,
        SessionRoute,
        InboundMessage,
        SessionKeying,
        Erasure,
    ):
        for name in dir(aggregate):
            member = getattr(aggregate, name)
            if (
                isinstance(member, type)
                and issubclass(member, CanMutateAggregate)
                and member.__qualname__.startswith(aggregate.__name__ + ".")
                and member.__qualname__.count(".") == 1
                and name not in ("Event", "Created", "Snapshot")
                and not (issubclass(member, Aggregate.Created) and name == "Created")
            ):
                topics.add(get_topic(member))
    return sorted(topics)


# -- PostgreSQL: the same rows in a fresh schema -----------------------------------------------

_PG_EVENTS = {"ledger": "gateway_ledger_events", "sessions": "gateway_sessions_events"}
_PG_SNAPSHOTS = "gateway_sessions_snapshots"  # only the session store takes snapshots
_PG_COPIED = ("gateway_ledger_subject_keys", "gateway_ledger_privacy_meta")


def create_postgres_tables(url: str) -> None:
    """The schema's tables as this release's own code creates them: the ledger (and its key
    tables, through the check a gateway makes at start) and the session store (without its
    keying record: that row comes from the export like every other)."""
    from gateway_ledger.bootstrap import DeliveryLedger, SessionStore
    from gateway_ledger.infrastructure.eventstore.store import store_environment
    from gateway_ledger.infrastructure.ownership.leases import LeaseSettings

    ledger = DeliveryLedger.open(url, lease=LeaseSettings(enabled=False), check_key=False)
    try:
        ledger.check_writable()
    finally:
        ledger.close()
    sessions = SessionStore(store_environment(url), raw_keys=True, keying_check=False)
    sessions.close()


def load_into_postgres(rows_path: Path, url: str) -> dict[str, int]:
    """Insert an exported store's rows, unchanged and in their order, into a fresh schema
    at ``url`` (tables made by :func:`create_postgres_tables`); returns rows per table."""
    from psycopg import sql

    from gateway_ledger.infrastructure.eventstore.postgres import connect, parse_postgres_url

    create_postgres_tables(url)
    params = parse_postgres_url(url)
    schema = params["schema"]
    counts: dict[str, int] = {}
    with connect(params) as conn:
        for table in (*_PG_EVENTS.values(), _PG_SNAPSHOTS, *_PG_COPIED):
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, table)))
        for line in read_rows(rows_path):
            table, row = line["table"], {k: _decode(v) for k, v in line["row"].items()}
            if table in (_SQLITE_EVENTS, _SQLITE_SNAPSHOTS):
                if table == _SQLITE_EVENTS:
                    half = "sessions" if _sessions_topic(row["topic"]) else "ledger"
                    target = _PG_EVENTS[half]
                else:  # the library's one Snapshot topic; only sessions take snapshots
                    target = _PG_SNAPSHOTS
                row = {
                    "originator_id": UUID(row["originator_id"]),
                    "originator_version": row["originator_version"],
                    "topic": row["topic"],
                    "state": row["state"],
                }
            elif table in _PG_COPIED:
                target = table
            else:
                raise ValueError(f"{rows_path}: no PostgreSQL table for {table}")
            columns = list(row)
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    sql.Identifier(schema, target),
                    sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                    sql.SQL(", ").join(sql.Placeholder() * len(columns)),
                ),
                [row[c] for c in columns],
            )
            counts[target] = counts.get(target, 0) + 1
    return counts
