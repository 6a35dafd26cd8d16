"""``gateway-ledger backup DEST`` and ``gateway-ledger restore BACKUP --db DEST``.

SQLite: SQLite's online backup of the live store (gateways may keep writing), written
owner-only to DEST. The master key and the session secret are NOT copied unless
``--with-keys``: a backup holds sealed data, and the key kept apart is what makes it
unreadable to whoever finds the backup. PostgreSQL: use ``pg_dump`` (README, "Backup and
restore"); this command says so.
"""

from __future__ import annotations

import argparse

from gateway_ledger import bootstrap
from gateway_ledger.entrypoints.console import Subcommands, add_common, print_json, usage_error


def register(subparsers: Subcommands) -> None:
    backup = subparsers.add_parser(
        "backup",
        help="a consistent copy of a live SQLite store (online backup, not a file copy)",
        description="The copy is one moment of the store; writers wait at most one step. "
        "The master key is not copied unless --with-keys.",
    )
    backup.add_argument("dest", metavar="DEST", help="the backup file to write")
    backup.add_argument(
        "--with-keys",
        action="store_true",
        help="also copy the master key and session secret beside DEST (DEST.key, ...)",
    )
    backup.add_argument("--force", action="store_true", help="overwrite DEST")
    add_common(backup)
    backup.set_defaults(handler=run_backup)
    restore = subparsers.add_parser(
        "restore",
        help="restore a backup file into a new SQLite store (then run verify and sweep)",
    )
    restore.add_argument("backup", metavar="BACKUP")
    restore.add_argument("--force", action="store_true", help="replace an existing store")
    add_common(restore)
    restore.set_defaults(handler=run_restore)


def run_backup(args: argparse.Namespace) -> int:
    if bootstrap.is_postgres_location(args.db):
        raise usage_error(
            "backup copies SQLite stores; for PostgreSQL use pg_dump --schema=SCHEMA "
            "--format=custom and pg_restore (README: Backup and restore)"
        )
    result = bootstrap.backup_store(args.db, args.dest, with_keys=args.with_keys, force=args.force)
    if args.json:
        print_json(result)
        return 0
    print(f"backup of {args.db} written to {args.dest} ({result['pages']} pages)")
    if result["keys"]:
        print(f"  key material copied: {', '.join(result['keys'])} (keep these apart)")
    else:
        print("  the master key was not copied: keep it apart; restore needs it (DEST.key)")
    return 0


def run_restore(args: argparse.Namespace) -> int:
    if bootstrap.is_postgres_location(args.db):
        raise usage_error("restore writes SQLite stores; for PostgreSQL use pg_restore")
    pages = bootstrap.restore_store(args.backup, args.db, force=args.force)
    if args.json:
        print_json({"store": args.db, "pages": pages})
        return 0
    print(f"restored {args.backup} into {args.db} ({pages} pages)")
    print("  next: put the master key beside it (or set it), then verify and sweep")
    return 0
