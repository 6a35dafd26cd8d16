"""``gateway-ledger prune --older-than AGE [--dry-run] [--archive FILE]`` (ADR 0053).

Resolved obligations (delivered, abandoned) whose last transition is older than AGE
leave the hot store: their events are appended to the archive (gzip'd JSON lines, one
stream per line; read by ``history --archive`` and ``audit duplicates --archive``), a
tombstone without personal data stays. Nothing unresolved is ever pruned.

``--sessions``: ended sessions (no key's current one) that ended longer than AGE ago go
the same way, into the same archive; ``--delete-sessions``: their events are deleted
instead, on the operator's word. A current session is never pruned.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from gateway_ledger.application.sessions.retention import SessionPruneReport
from gateway_ledger.bootstrap import open_session_store
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    parse_age,
    print_json,
    usage_error,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "prune",
        help="move resolved obligations older than AGE to an archive, keep tombstones",
        description="Only delivered and abandoned obligations older than AGE are pruned, "
        "in batches (each one short transaction). --dry-run counts them.",
    )
    parser.add_argument("--older-than", required=True, metavar="AGE", help="0s, 2h, 30d, ...")
    parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
    parser.add_argument(
        "--archive",
        metavar="FILE",
        help="archive file to append to (default beside an SQLite store: DB.archive.jsonl.gz)",
    )
    parser.add_argument(
        "--forget-tombstones-older-than",
        metavar="AGE",
        help="also delete tombstones of obligations pruned longer ago (their ids count as new)",
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="also prune ended sessions (never a current one) that ended before AGE",
    )
    parser.add_argument(
        "--delete-sessions",
        action="store_true",
        help="with --sessions: delete those sessions' events instead of archiving them",
    )
    parser.add_argument("--batch", type=int, default=100, help="obligations per transaction")
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    age = parse_age(args.older_than, name="--older-than")
    if args.batch < 1:
        raise usage_error("--batch must be 1 or more")
    if args.delete_sessions and not args.sessions:
        raise usage_error("--delete-sessions goes with --sessions")
    ledger = open_ledger(args.db, writing=not args.dry_run)
    try:
        forget = args.forget_tombstones_older_than
        report = ledger.prune(
            age,
            archive=args.archive,
            dry_run=args.dry_run,
            batch_size=args.batch,
            forget_tombstones_older_than=(
                None if forget is None else parse_age(forget, name="--forget-tombstones-older-than")
            ),
        )
    finally:
        ledger.close()
    sessions = prune_sessions(args, age) if args.sessions else None
    if args.json:
        data = report.to_dict()
        if args.sessions:
            data["sessions"] = None if sessions is None else sessions.to_dict()
        print_json(data)
        return 0
    if args.sessions:
        print(describe_sessions(sessions))  # first: the obligations' lines end early
    if report.dry_run:
        states = ", ".join(f"{n} {s}" for s, n in sorted(report.by_state.items())) or "none"
        print(f"prune (dry run): {report.candidates} obligations resolved before "
              f"{report.cutoff.isoformat()} would be archived ({states})")  # fmt: skip
        return 0
    states = ", ".join(f"{n} {s}" for s, n in sorted(report.by_state.items())) or "none"
    print(f"pruned {report.pruned} obligations ({states}) resolved before "
          f"{report.cutoff.isoformat()}; archive {report.archive}")  # fmt: skip
    print(
        f"  {report.batches} batches, writers held at most {report.max_hold_seconds * 1000:.1f} ms"
        f" per batch; {report.kept_changed} kept (changed meanwhile, or the newest event)"
    )
    if report.tombstones_forgotten:
        print(f"  {report.tombstones_forgotten} old tombstones deleted")
    return 0


def prune_sessions(args: argparse.Namespace, age: timedelta) -> SessionPruneReport | None:
    """The ended sessions' prune (None: the store has no sessions)."""
    store = open_session_store(args.db)
    if store is None:
        return None
    try:
        return store.prune_sessions(
            age,
            archive=None if args.delete_sessions else args.archive,
            delete=args.delete_sessions,
            dry_run=args.dry_run,
            batch_size=args.batch,
        )
    finally:
        store.close()


def describe_sessions(report: SessionPruneReport | None) -> str:
    if report is None:
        return "sessions: this store has none"
    if report.dry_run:
        return (
            f"sessions (dry run): {report.candidates} ended before "
            f"{report.cutoff.isoformat()} would be " + ("deleted" if report.deleted else "archived")
        )
    where = "deleted" if report.deleted else f"archived to {report.archive}"
    return (
        f"sessions: {report.pruned} ended before {report.cutoff.isoformat()} {where}; "
        f"{report.kept_changed} kept (changed meanwhile, or the newest event)"
    )
