"""Reading an existing hermes-agent installation (hermes-formats.md §3, §4), never writing it.

``state.db`` is opened read-only (``mode=ro``, ``query_only``): SQLite reads what is
committed, in the database file and in its write-ahead log, and a read-only connection
never checkpoints, so not one byte of the installation changes, even while its gateway
runs and writes. Its routing index (``gateway_routing``, every scope; then
``sessions/sessions.json`` for keys the table lacks), its ``sessions`` and ``messages``
(legacy ``sessions/<id>.jsonl`` transcripts where the table has none), the restart
failure counts and its ``delivery_obligations`` table become the application's import
values. Anything that cannot be read is a :class:`SourceProblem` naming its file and item;
a key with any problem is left out whole, never half-imported.

Times: upstream writes naive local datetimes (routing entries, old JSONL lines) and UTC
epoch floats (database columns). Naive ones are read in ``timezone`` when given, else in
this machine's zone, and the report says which (``time_basis``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import closing
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import attrs

from gateway_ledger.application.delivery.importing import ImportedRow
from gateway_ledger.application.sessions.importing import (
    ImportedKey,
    ImportedMessage,
    ImportedSession,
)
from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.domain.sessions.session import is_session_id
from gateway_ledger.domain.sessions.source import SessionSource

JSON_PREFIX = "\x00json:"
SUSPEND_AFTER_FAILURES = 3


@attrs.frozen
class SourceProblem:
    """Something of the installation that was not imported, and why (no personal data:
    files, keys' positions, ids and the kind of fault)."""

    file: str
    item: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.define
class HermesInstallation:
    home: Path
    time_basis: str
    keys: list[ImportedKey] = attrs.Factory(list)
    rows: list[ImportedRow] = attrs.Factory(list)
    problems: list[SourceProblem] = attrs.Factory(list)


class BadItem(Exception):
    """One item of the source cannot be imported (its problem is recorded)."""


def machine_zone_name() -> str:
    name = os.environ.get("TZ", "").strip()
    if name:
        return name
    try:
        return Path("/etc/timezone").read_text().strip() or time.tzname[0]
    except OSError:
        link = Path("/etc/localtime")
        if link.is_symlink():
            return str(link.readlink()).split("zoneinfo/")[-1]
        return time.tzname[0]


class Times:
    """Upstream's times as aware datetimes: naive ISO strings in the chosen zone, floats as
    UTC epochs."""

    def __init__(self, timezone: str | None) -> None:
        self.zone: tzinfo | None = ZoneInfo(timezone) if timezone else None
        self.basis = (
            f"naive local times read in {timezone} (--timezone); epoch floats as UTC"
            if timezone
            else f"naive local times read in this machine's zone ({machine_zone_name()}); "
            "epoch floats as UTC"
        )

    def naive(self, value: object) -> datetime | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise BadItem(f"a time must be an ISO string, not {type(value).__name__}")
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise BadItem("a time is not ISO 8601") from None
        if moment.tzinfo is not None:
            return moment
        return moment.replace(tzinfo=self.zone) if self.zone else moment.astimezone()

    @staticmethod
    def epoch(value: object) -> datetime:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadItem("an epoch time must be a number")
        return datetime.fromtimestamp(value, UTC)

    def either(self, value: object) -> datetime | None:
        """A JSONL ``timestamp``: an ISO string before 2026-05-18, an epoch float after."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return self.epoch(value)
        return self.naive(value)


def open_read_only(path: Path) -> sqlite3.Connection:
    """The installation's database, read-only: no write, no checkpoint, WAL content read.

    With no ``-wal`` file beside it (its gateway stopped cleanly) it is opened
    ``immutable``: SQLite would otherwise create ``-wal`` and ``-shm`` files for a
    database in WAL mode, even read-only. With one (the gateway runs, or did not stop
    cleanly) it is opened ``mode=ro``, reading the committed frames of the WAL through
    the existing shared-memory index (``-shm``, where every reader marks what it reads).
    """
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA query_only=1")
    return conn


def tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def read_installation(home: str | Path, *, timezone: str | None = None) -> HermesInstallation:
    """Everything importable of the installation at ``home`` ($HERMES_HOME)."""
    home = Path(home)
    if not home.is_dir():
        raise LedgerError(f"no hermes installation at {home}: not a directory")
    times = Times(timezone)
    found = HermesInstallation(home=home, time_basis=times.basis)
    db_path = home / "state.db"
    sessions: dict[str, Mapping[str, Any]] = {}
    messages: dict[str, list[ImportedMessage]] = defaultdict(list)
    entries: dict[str, tuple[str, Any]] = {}
    if db_path.exists():
        with closing(open_read_only(db_path)) as conn:
            present = tables(conn)
            if "sessions" in present:
                sessions = {r["id"]: dict(r) for r in conn.execute("SELECT * FROM sessions")}
            if "messages" in present:
                _read_messages(conn, times, messages, found)
            if "gateway_routing" in present:
                for r in conn.execute("SELECT session_key, entry_json FROM gateway_routing"):
                    entries.setdefault(
                        r["session_key"], ("state.db:gateway_routing", r["entry_json"])
                    )
            if "delivery_obligations" in present:
                found.rows = list(_read_obligations(conn, found))
    _read_sessions_json(home / "sessions" / "sessions.json", entries, found)
    failures = _restart_failures(home / ".restart_failure_counts", found)
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in sessions.values():
        if row.get("session_key"):
            by_key[row["session_key"]].append(row)
    taken: dict[str, str] = {}
    for position, (key, (origin_file, raw)) in enumerate(entries.items()):
        try:
            entry = json.loads(raw) if isinstance(raw, str) else raw
            if not isinstance(entry, dict):
                raise BadItem("the entry is not an object")
            imported = _key(key, entry, sessions, by_key, messages, times, home)
            shared = [s.session_id for s in imported.sessions if s.session_id in taken]
            if shared:
                raise BadItem(f"session {shared[0]} is already that of another key")
            suspended = imported.suspended or failures.get(key, 0) >= SUSPEND_AFTER_FAILURES
            where = (origin_file, f"key #{position + 1}")
            imported = attrs.evolve(imported, suspended=suspended, origin=where)
        except (BadItem, LedgerError, ValueError, KeyError, TypeError) as e:
            found.problems.append(SourceProblem(origin_file, f"key #{position + 1}", _why(e)))
            continue
        for s in imported.sessions:
            taken[s.session_id] = key
        found.keys.append(imported)
    return found


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if not isinstance(error, BadItem) else str(error)


def _read_messages(
    conn: sqlite3.Connection,
    times: Times,
    into: dict[str, list[ImportedMessage]],
    found: HermesInstallation,
) -> None:
    columns = {r[1] for r in conn.execute("PRAGMA table_info(messages)")}
    active = "WHERE active=1 " if "active" in columns else ""
    pmid = "platform_message_id" if "platform_message_id" in columns else "NULL"
    query = (
        f"SELECT id, session_id, role, content, timestamp, {pmid} FROM messages {active}ORDER BY id"
    )
    for row in conn.execute(query):
        if row[2] == "session_meta":
            continue  # a session's first row, no message
        try:
            into[row[1]].append(_message(row[2], row[3], times.epoch(row[4]), row[5]))
        except BadItem as e:
            found.problems.append(SourceProblem("state.db:messages", f"row {row[0]}", str(e)))


def _message(role: object, content: object, at: datetime, pmid: object) -> ImportedMessage:
    if not isinstance(role, str):
        raise BadItem("a message without a role")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content[len(JSON_PREFIX) :] if content.startswith(JSON_PREFIX) else content
    else:
        text = json.dumps(content, ensure_ascii=False)  # a JSONL line's list or object
    ref = None if pmid is None or pmid == "" else str(pmid)
    return ImportedMessage(role=role, content=text, timestamp=at, platform_message_id=ref)


def _read_obligations(conn: sqlite3.Connection, found: HermesInstallation) -> Iterator[ImportedRow]:
    for r in conn.execute("SELECT * FROM delivery_obligations ORDER BY created_at"):
        try:
            started = r["owner_started_at"]
            yield ImportedRow(
                obligation_id=str(r["obligation_id"]),
                session_key=str(r["session_key"]),
                platform=str(r["platform"]),
                chat_id=str(r["chat_id"]),
                thread_id=None if r["thread_id"] in (None, "") else str(r["thread_id"]),
                content=str(r["content"]),
                state=str(r["state"]),
                attempts=int(r["attempts"] or 0),
                created_at=float(r["created_at"]),
                updated_at=float(r["updated_at"]),
                owner_pid=None if r["owner_pid"] is None else int(r["owner_pid"]),
                owner_started_at=None if started is None else int(started),
                last_error=r["last_error"],
            )
        except (TypeError, ValueError, IndexError) as e:
            found.problems.append(
                SourceProblem("state.db:delivery_obligations", str(r[0]), _why(e))
            )


def _read_sessions_json(
    path: Path, entries: dict[str, tuple[str, Any]], found: HermesInstallation
) -> None:
    if not path.exists():
        return
    try:
        mirror = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(mirror, dict):
            raise BadItem("not a JSON object")
    except (OSError, ValueError, BadItem) as e:
        found.problems.append(SourceProblem("sessions/sessions.json", "whole file", _why(e)))
        return
    for key, entry in mirror.items():
        if key.startswith("_") or not isinstance(entry, dict):
            continue
        entries.setdefault(key, ("sessions/sessions.json", entry))  # the database wins


def _restart_failures(path: Path, found: HermesInstallation) -> dict[str, int]:
    if not path.exists():
        return {}
    try:
        counts = json.loads(path.read_text(encoding="utf-8"))
        return {str(k): int(v) for k, v in counts.items()}
    except (OSError, ValueError, TypeError, AttributeError) as e:
        found.problems.append(SourceProblem(".restart_failure_counts", "whole file", _why(e)))
        return {}


def _compression_tip(session_id: str, sessions: Mapping[str, Mapping[str, Any]]) -> str:
    """Follow ``end_reason='compression'`` to the live child, as upstream's routing heals."""
    seen = {session_id}
    while (sessions.get(session_id) or {}).get("end_reason") == "compression":
        children = [s for s in sessions.values() if s.get("parent_session_id") == session_id]
        if not children:
            break
        session_id = max(children, key=lambda s: s.get("started_at") or 0)["id"]
        if session_id in seen:
            break
        seen.add(session_id)
    return session_id


def _source(entry: Mapping[str, Any], row: Mapping[str, Any] | None) -> SessionSource:
    origin = entry.get("origin")
    if not origin and row and row.get("origin_json"):
        origin = json.loads(row["origin_json"])
    if origin:
        return SessionSource.from_dict(origin)
    if row is None or not row.get("source"):
        raise BadItem("neither an origin nor a sessions row says where the session is")
    return SessionSource(
        platform=row["source"],
        chat_id=row.get("chat_id") or "",
        chat_type=row.get("chat_type") or "dm",
        user_id=row.get("user_id"),
        thread_id=row.get("thread_id"),
    )


def _key(
    key: str,
    entry: Mapping[str, Any],
    sessions: Mapping[str, Mapping[str, Any]],
    by_key: Mapping[str, list[Mapping[str, Any]]],
    messages: Mapping[str, list[ImportedMessage]],
    times: Times,
    home: Path,
) -> ImportedKey:
    current_id = _compression_tip(str(entry["session_id"]), sessions)
    earlier = sorted(
        (
            r
            for r in by_key.get(key, [])
            if r["id"] != current_id and r.get("end_reason") != "compression"
        ),
        key=lambda r: (r.get("started_at") or 0, r["id"]),
    )
    current_row = sessions.get(current_id)
    source = _source(entry, current_row)
    items: list[ImportedSession] = []
    for row in earlier:
        own = _source({}, row) if row.get("origin_json") or row.get("source") else source
        started = times.epoch(row["started_at"])
        items.append(
            _session(row["id"], own, started, messages, times, home, row.get("end_reason"))
        )
    created = (
        times.epoch(current_row["started_at"])
        if current_row is not None
        else times.naive(entry.get("created_at"))
    )
    if created is None:
        raise BadItem("the current session has no creation time")
    items.append(_session(current_id, source, created, messages, times, home, None))
    return ImportedKey(
        key=key,
        sessions=tuple(items),
        suspended=bool(entry.get("suspended", False)),
        resume_pending=bool(entry.get("resume_pending", False)),
        resume_reason=entry.get("resume_reason"),
        resume_marked_at=_optional_time(times, entry.get("last_resume_marked_at")),
        updated_at=times.naive(entry.get("updated_at")),
    )


def _optional_time(times: Times, value: object) -> datetime | None:
    try:
        return times.naive(value)
    except BadItem:
        return None  # upstream reads an unparseable mark as none


def _session(
    session_id: str,
    source: SessionSource,
    created: datetime,
    messages: Mapping[str, list[ImportedMessage]],
    times: Times,
    home: Path,
    end_reason: str | None,
) -> ImportedSession:
    if not is_session_id(session_id):
        raise BadItem(f"session id {session_id!r} is not YYYYmmdd_HHMMSS_<8 hex>")
    found = messages.get(session_id) or _jsonl(home / "sessions" / f"{session_id}.jsonl", times)
    return ImportedSession(
        session_id=session_id,
        source=source,
        created_at=created,
        messages=tuple(found),
        end_reason=end_reason,
    )


def _jsonl(path: Path, times: Times) -> list[ImportedMessage]:
    """A legacy transcript; a line that does not read spoils the whole session."""
    if not path.exists():
        return []
    out: list[ImportedMessage] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise BadItem("not an object")
                if item.get("role") == "session_meta":
                    continue
                at = times.either(item.get("timestamp"))
                if at is None:
                    raise BadItem("no timestamp")
                out.append(
                    _message(item.get("role"), item.get("content"), at, item.get("message_id"))
                )
            except (ValueError, BadItem) as e:
                raise BadItem(f"sessions/{path.name} line {number}: {_why(e)}") from None
    return out
