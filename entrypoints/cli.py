"""The ``gateway-ledger`` console script.

Each command lives in its own module under ``entrypoints/commands`` and exposes
``register(subparsers)``; the module list below is the only shared place.
Exit codes: 0 ok, 1 a check found problems, 2 usage or store error (one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from eventsourcing.persistence import PersistenceError

from gateway_ledger.domain.errors import LedgerError

COMMAND_MODULES: tuple[str, ...] = (
    "demo",
    "simulate",
    "status",
    "listing",
    "history",
    "retry",
    "abandon",
    "sweep",
    "audit",
    "projections",
    "sessions",  # before "forget", which adds itself to the sessions command
    "forget",
    "metrics",
)

DB_ENV = "GATEWAY_LEDGER_DB"
DEFAULT_DB = "gateway-ledger.db"


class UsageError(Exception):
    """A command was called wrongly: exit 2 with one line on stderr."""


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get(DB_ENV, DEFAULT_DB),
        help=f"SQLite file or postgresql:// URL (default: ${DB_ENV} or {DEFAULT_DB})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway-ledger",
        description="Event-sourced session and delivery ledger for chat-agent gateways.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    parser.add_argument(
        "--db",
        dest="global_db",
        default=None,
        help="the store, for every command (same as the command's own --db)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"gateway_ledger.entrypoints.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.global_db is not None and hasattr(args, "db"):
        args.db = args.global_db  # `gateway-ledger --db X status` means the same as `status --db X`
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except UsageError as e:
        print(f"gateway-ledger: {e}", file=sys.stderr)
        return 2
    except LedgerError as e:
        print(f"gateway-ledger: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except (PersistenceError, OSError) as e:
        print(
            f"gateway-ledger: store error: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
