"""``gateway-ledger sessions forget KEY``: erase one session's personal data.

The key is destroyed, unresolved replies are abandoned (reason ``erased``), the open
conversation is suspended, the erasure is recorded; the history of both the replies and
the conversations stays, showing ``[erased]``. The session store is looked for in ``--db``
unless ``--sessions-db`` says where it lives. A cleanup that an open reader kept from
finishing (ADR 0028) is said so, and ``sessions forget --finish`` completes it (exit 1 while
it is still pending). If a ``sessions`` command already
exists, ``forget`` is added to it; otherwise this module creates ``sessions``.
"""

from __future__ import annotations

import argparse
import json
import os

from gateway_ledger.application.privacy.erasure import CLEANUP_PENDING_NOTE
from gateway_ledger.bootstrap import finish_erasure_cleanup, forget_session
from gateway_ledger.entrypoints.console import Subcommands, usage_error
from gateway_ledger.infrastructure.eventstore.store import existing_store_environment


def register(sessions: Subcommands) -> None:
    """Add ``sessions forget`` to the ``sessions`` command's subcommands."""
    from gateway_ledger.entrypoints.cli import add_db_option

    parser = sessions.add_parser(
        "forget",
        help="erase a session's personal data (the audit trail stays, showing [erased])",
    )
    parser.add_argument("session_key", metavar="KEY", nargs="?", help="the session key to forget")
    parser.add_argument(
        "--finish",
        action="store_true",
        help="finish the cleanup earlier erasures left pending (no KEY); exit 1 if still pending",
    )
    parser.add_argument(
        "--by",
        default=os.environ.get("USER", ""),
        help="who asked for the erasure, kept in the erasure record (default: $USER)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_db_option(parser)
    parser.add_argument(
        "--sessions-db",
        default=None,
        help="where the session store lives, if not in --db (SQLite file or postgresql:// URL)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Like every other command: an existing, writable gateway-ledger store, or nothing
    # (a mistyped --db must not become a new, empty store that "erased" the subject).
    existing_store_environment(args.db, writing=True)
    if args.sessions_db is not None:
        existing_store_environment(args.sessions_db, writing=True)
    if args.finish:
        if args.session_key is not None:
            raise usage_error("--finish takes no KEY")
        return run_finish(args)
    if args.session_key is None:
        raise usage_error("sessions forget needs a KEY (or --finish)")
    report = forget_session(
        args.db, args.session_key, requested_by=args.by, sessions=args.sessions_db
    )
    found = report.destroyed_keys or report.abandoned or report.sessions
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    if not found:
        # Recorded (the request is on the record) but nothing matched: a mistyped key
        # must not read as a successful erasure.
        raise usage_error(
            f"nothing found to erase for that session key in {args.db} (no data key, "
            f"reply or session; erasure {report.erasure_id} recorded): check the key"
        )
    if args.json:
        return 0
    print(
        f"subject {report.subject_id} erased at {report.erased_at.isoformat()}: "
        f"{len(report.destroyed_keys)} key(s) destroyed, "
        f"{len(report.abandoned)} unresolved reply(ies) abandoned, "
        f"{len(report.sessions)} session(s) erased"
    )
    if report.cleanup_pending:
        print(CLEANUP_PENDING_NOTE)
    return 0


def run_finish(args: argparse.Namespace) -> int:
    done = finish_erasure_cleanup(args.db, sessions=args.sessions_db)
    if args.json:
        print(json.dumps({"cleanup_pending": not done}))
    elif done:
        print("erasure cleanup finished: no copy of a destroyed key is pending")
    else:
        print(
            "erasure cleanup still pending: an open reader or transaction holds the store's "
            "files; run again once it has finished"
        )
    return 0 if done else 1
