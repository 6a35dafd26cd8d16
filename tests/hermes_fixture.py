"""A hermes-agent installation in upstream's on-disk formats (hermes-formats.md §1.2, §2.3,
§3), for the importer's tests and benchmark: ``state.db`` with ``sessions``, ``messages``,
``gateway_routing`` and ``delivery_obligations`` as upstream creates them (WAL mode),
``sessions/sessions.json``, a legacy JSONL transcript and ``.restart_failure_counts``."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, session_key TEXT, chat_id TEXT,
    chat_type TEXT, thread_id TEXT, display_name TEXT, origin_json TEXT, profile_name TEXT,
    started_at REAL NOT NULL, ended_at REAL, end_reason TEXT, parent_session_id TEXT,
    expiry_finalized INTEGER DEFAULT 0, archived INTEGER DEFAULT 0, rewind_count INTEGER DEFAULT 0,
    message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0, model TEXT, title TEXT
);
CREATE INDEX IF NOT EXISTS idx_sessions_key ON sessions(session_key, started_at DESC);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
    content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, effect_disposition TEXT,
    timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT, reasoning TEXT,
    platform_message_id TEXT, observed INTEGER DEFAULT 0, active INTEGER DEFAULT 1,
    compacted INTEGER DEFAULT 0, api_content TEXT
);
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '', session_key TEXT NOT NULL, entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL, PRIMARY KEY (scope, session_key)
);
CREATE TABLE IF NOT EXISTS delivery_obligations (
    obligation_id TEXT PRIMARY KEY, session_key TEXT NOT NULL, platform TEXT NOT NULL,
    chat_id TEXT NOT NULL, thread_id TEXT, content TEXT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    owner_pid INTEGER, owner_started_at INTEGER, last_error TEXT
);
"""

SCOPE = "/home/alice/.hermes/sessions"


def compute_obligation_id(session_key: str, message_ref: str, content: str) -> str:
    raw = f"{session_key}|{message_ref}|{content}".encode("utf-8", errors="replace")
    return hashlib.sha256(raw).hexdigest()[:24]


def naive(epoch: float) -> str:
    """Upstream's entry times: ``isoformat()`` of a naive local datetime."""
    return datetime.fromtimestamp(epoch).isoformat()


def session_id(epoch: float, n: int) -> str:
    return f"{datetime.fromtimestamp(epoch):%Y%m%d_%H%M%S}_{n:08x}"


def source(platform: str, chat_id: str, **extra: Any) -> dict[str, Any]:
    """``SessionSource.to_dict()``."""
    data = {
        "platform": platform,
        "chat_id": chat_id,
        "chat_name": extra.pop("chat_name", None),
        "chat_type": extra.pop("chat_type", "dm"),
        "user_id": extra.pop("user_id", None),
        "user_name": extra.pop("user_name", None),
        "thread_id": extra.pop("thread_id", None),
        "chat_topic": None,
    }
    data.update(extra)
    return data


def entry(
    key: str, sid: str, origin: dict[str, Any], created: float, updated: float, **flags: Any
) -> dict[str, Any]:
    """``SessionEntry.to_dict()``."""
    data: dict[str, Any] = {
        "session_key": key,
        "session_id": sid,
        "created_at": naive(created),
        "updated_at": naive(updated),
        "display_name": None,
        "platform": origin["platform"],
        "chat_type": origin["chat_type"],
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "total_tokens": 0,
        "last_prompt_tokens": 0,
        "estimated_cost_usd": 0.0,
        "cost_status": "unknown",
        "expiry_finalized": False,
        "suspended": False,
        "resume_pending": False,
        "resume_reason": None,
        "last_resume_marked_at": None,
        "is_fresh_reset": False,
        "was_auto_reset": False,
        "reset_had_activity": False,
        "auto_reset_reason": None,
        "origin": origin,
    }
    data.update(flags)
    return data


class Installation:
    """Writes an installation the way upstream's code would have."""

    def __init__(self, home: Path) -> None:
        self.home = home
        (home / "sessions").mkdir(parents=True, exist_ok=True)
        self.db = home / "state.db"
        self.conn = sqlite3.connect(self.db)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.executescript(SCHEMA)
        self.mirror: dict[str, Any] = {"_README": "legacy mirror of gateway_routing"}

    def add_session(
        self,
        sid: str,
        key: str,
        origin: dict[str, Any],
        started: float,
        messages: list[tuple[str, str | None, float, str | None]] = (),  # type: ignore[assignment]
        *,
        end_reason: str | None = None,
    ) -> None:
        self.conn.execute(
            "INSERT INTO sessions (id, source, user_id, session_key, chat_id, chat_type, "
            "thread_id, origin_json, started_at, ended_at, end_reason, message_count) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                sid,
                origin["platform"],
                origin.get("user_id"),
                key,
                origin["chat_id"],
                origin["chat_type"],
                origin.get("thread_id"),
                json.dumps(origin),
                started,
                started + 1 if end_reason else None,
                end_reason,
                len(messages),
            ),
        )
        rows = [(sid, "session_meta", None, started, None)]
        rows += [(sid, role, content, at, pmid) for role, content, at, pmid in messages]
        self.conn.executemany(
            "INSERT INTO messages (session_id, role, content, timestamp, platform_message_id) "
            "VALUES (?,?,?,?,?)",
            rows,
        )

    def route(self, key: str, data: dict[str, Any], *, mirror_only: bool = False) -> None:
        if not mirror_only:
            self.conn.execute(
                "INSERT OR REPLACE INTO gateway_routing VALUES (?,?,?,?)",
                (SCOPE, key, json.dumps(data), 0.0),
            )
        self.mirror[key] = data

    def obligation(
        self,
        key: str,
        message_ref: str,
        content: str,
        state: str,
        created: float,
        *,
        attempts: int = 0,
        platform: str = "telegram",
        chat_id: str = "99",
        owner_pid: int | None = 999999,
        owner_started_at: int | None = 1234,
        last_error: str | None = None,
        updated: float | None = None,
    ) -> str:
        oid = compute_obligation_id(key, message_ref, content)
        self.conn.execute(
            "INSERT OR REPLACE INTO delivery_obligations VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                oid,
                key,
                platform,
                chat_id,
                None,
                content,
                state,
                attempts,
                created,
                updated or created,
                owner_pid,
                owner_started_at,
                last_error,
            ),
        )
        return oid

    def commit(self) -> None:
        self.conn.commit()

    def write_files(self, *, failure_counts: dict[str, int] | None = None) -> None:
        path = self.home / "sessions" / "sessions.json"
        path.write_text(json.dumps(self.mirror, indent=2))
        if failure_counts:
            (self.home / ".restart_failure_counts").write_text(json.dumps(failure_counts))

    def close(self) -> None:
        self.conn.close()


def snapshot(home: Path) -> dict[str, str]:
    """Every file of the installation and a hash of its bytes (to prove nothing changed)."""
    return {
        str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.rglob("*"))
        if p.is_file()
    }


def bulk(inst: Installation, sessions: int, messages: int, obligations: int, t0: float) -> None:
    """``sessions`` DM keys with ``messages`` messages each, and ``obligations`` rows."""

    def rows() -> Iterator[tuple[str, str, str | None, float, str | None]]:
        for n in range(sessions):
            sid = session_id(t0, n)
            for m in range(messages):
                role = "user" if m % 2 == 0 else "assistant"
                pmid = str(m) if role == "user" else None
                yield sid, role, f"message {m} of conversation {n}", t0 + m, pmid

    for n in range(sessions):
        key = f"agent:main:telegram:dm:{100000 + n}"
        origin = source("telegram", str(100000 + n), user_id=str(100000 + n), user_name=f"u{n}")
        sid = session_id(t0, n)
        inst.conn.execute(
            "INSERT INTO sessions (id, source, user_id, session_key, chat_id, chat_type, "
            "origin_json, started_at, message_count) VALUES (?,?,?,?,?,?,?,?,?)",
            (sid, "telegram", origin["user_id"], key, origin["chat_id"], "dm",
             json.dumps(origin), t0, messages),
        )  # fmt: skip
        inst.route(key, entry(key, sid, origin, t0, t0 + messages))
    inst.conn.executemany(
        "INSERT INTO messages (session_id, role, content, timestamp, platform_message_id) "
        "VALUES (?,?,?,?,?)",
        rows(),
    )
    states = ("delivered", "delivered", "abandoned", "attempting", "failed", "pending")
    for n in range(obligations):
        key = f"agent:main:telegram:dm:{100000 + n % max(sessions, 1)}"
        inst.obligation(key, str(n), f"reply {n}", states[n % len(states)], t0 + n % 100,
                        attempts=n % 3, chat_id=str(100000 + n % max(sessions, 1)))  # fmt: skip
    inst.commit()
