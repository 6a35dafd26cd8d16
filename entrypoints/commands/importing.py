"""``gateway-ledger import hermes PATH [--db] [--dry-run] [--json] [--timezone]``: bring an
existing hermes-agent installation's conversations and owed replies into the store."""

from __future__ import annotations

import argparse

from gateway_ledger.entrypoints.console import Subcommands, add_common, print_json
from gateway_ledger.entrypoints.hermes_import import import_hermes, problems_text


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "import",
        help="import an existing installation (read-only; idempotent)",
        description="Bring an existing gateway's sessions and owed replies across.",
    )
    kinds = parser.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True
    hermes = kinds.add_parser(
        "hermes",
        help="a hermes-agent home directory ($HERMES_HOME)",
        description=(
            "Reads PATH/state.db (read-only, WAL included), sessions/sessions.json and "
            "sessions/*.jsonl; writes each session key, its sessions and messages, and each "
            "owed reply with its history. Not one byte of PATH changes. Run it again: it "
            "imports nothing new."
        ),
    )
    hermes.add_argument("path", metavar="PATH")
    hermes.add_argument("--dry-run", action="store_true", help="read and check, write nothing")
    hermes.add_argument(
        "--timezone",
        metavar="ZONE",
        help="the zone upstream's naive local times were written in (default: this machine's)",
    )
    hermes.add_argument(
        "--raw-keys",
        action="store_true",
        help="a new store keeps upstream's raw session keys (default: keyed hashes)",
    )
    add_common(hermes)
    hermes.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    report = import_hermes(
        args.path,
        db=args.db,
        dry_run=args.dry_run,
        timezone=args.timezone,
        raw_keys=args.raw_keys,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.summary())
        for line in problems_text(report.problems):
            print(line)
    return 1 if report.problems else 0
