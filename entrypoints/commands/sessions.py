"""``gateway-ledger sessions list | show KEY | export SESSION_ID --dir DIR``.

Creates the ``sessions`` command; ``forget`` (entrypoints/commands/forget.py) adds itself
to it, so this module must come before ``forget`` in COMMAND_MODULES.
"""

from __future__ import annotations

import argparse

from gateway_ledger.application.sessions.admin import list_sessions, show_key
from gateway_ledger.bootstrap import SessionStore, open_session_store
from gateway_ledger.entrypoints.commands import forget
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    print_json,
    table,
    usage_error,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser("sessions", help="session commands")
    nested = parser.add_subparsers(dest="sessions_command", metavar="SUBCOMMAND")
    nested.required = True
    forget.register(nested)
    listing = nested.add_parser("list", help="every session, oldest first")
    add_common(listing)
    listing.set_defaults(handler=run_list)
    show = nested.add_parser("show", help="a session key's current and earlier sessions")
    show.add_argument("key", metavar="KEY", help="the session key, as stored")
    add_common(show)
    show.set_defaults(handler=run_show)
    export = nested.add_parser("export", help="write a session's transcript as JSON lines")
    export.add_argument("session_id", metavar="SESSION_ID")
    export.add_argument("--dir", required=True, help="directory for <SESSION_ID>.jsonl")
    add_common(export)
    export.set_defaults(handler=run_export)


def _store(location: str) -> SessionStore | None:
    return open_session_store(location)  # an existing store only (the store decides)


def run_list(args: argparse.Namespace) -> int:
    store = _store(args.db)
    sessions = () if store is None else list_sessions(store)
    if args.json:
        print_json({"sessions": [s.to_dict() for s in sessions], "count": len(sessions)})
        return 0
    rows = [
        [s.session_id, s.key, s.created_at, s.ended, s.end_reason, s.pruned or ""] for s in sessions
    ]
    print(table(["session", "key", "created (UTC)", "ended", "why", "pruned to"], rows))
    return 0


def run_show(args: argparse.Namespace) -> int:
    store = _store(args.db)
    if store is None:
        raise usage_error("this store has no sessions")
    found = show_key(store, args.key)
    if args.json:
        print_json(found.to_dict())
        return 0
    print(f"key {found.key}: current session {found.current_session_id}")
    rows = [
        [
            s.session_id,
            s.created_at,
            s.last_activity_at,
            "?" if s.message_count is None else s.message_count,
            s.ended,
            s.end_reason,
            s.pruned or "",
        ]
        for s in found.sessions
    ]
    heads = ["session", "created", "last activity", "messages", "ended", "why", "pruned to"]
    print(table(heads, rows, indent="  "))
    return 0


def run_export(args: argparse.Namespace) -> int:
    store = _store(args.db)
    if store is None:
        raise usage_error("this store has no sessions")
    path = store.export_transcript(args.session_id, args.dir)
    if args.json:
        print_json({"session_id": args.session_id, "path": str(path)})
        return 0
    print(f"session {args.session_id} exported to {path}")
    return 0
