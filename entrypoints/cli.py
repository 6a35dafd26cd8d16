"""The ``gateway-ledger`` console script.

Each command lives in its own module under ``entrypoints/commands`` and exposes
``register(subparsers)``; the module list below is the only shared place.
Exit codes: 0 ok, 1 a check found problems, 2 usage or store error (one line on stderr).
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import logging
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import NoReturn

import psycopg
from eventsourcing.persistence import PersistenceError

from gateway_ledger.application.observability import causes
from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.infrastructure.observability.logs import (
    FORMAT_ENV,
    FORMATS,
    ContextIds,
    StructuredFormatter,
)

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
    "sessions",  # with its "forget" subcommand (commands/forget.py)
    "metrics",
    "importing",  # "import hermes PATH"
    "verify",
    "backup",  # with "restore"
    "prune",
    "dead_letters",
)

DB_ENV = "GATEWAY_LEDGER_DB"
DEFAULT_DB = "gateway-ledger.db"


class UsageError(Exception):
    """A command was called wrongly: exit 2 with one line on stderr."""


class Parser(argparse.ArgumentParser):
    """argparse, but a wrong call is one line on stderr (exit 2), like every other failure."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    UsageError,
    LedgerError,
    PersistenceError,
    OSError,
    ValueError,  # UnicodeError and malformed settings among them
    OverflowError,
    sqlite3.Error,
    psycopg.Error,
)
"""Failures an operator can cause or meet (bad input, settings, files, servers): one line."""


def failure_line(error: BaseException) -> str:
    """The one line printed for a failure: the message of a ledger or usage error as it is,
    anything else prefixed with its kind; never a body (errors carry ids and counts)."""
    if isinstance(error, UsageError | LedgerError):
        text = str(error)
    else:
        kind = "store error: " if isinstance(error, PersistenceError | sqlite3.Error) else ""
        text = f"{kind}{type(error).__name__}: {error}"
    first = (text.strip().splitlines() or [type(error).__name__])[0]
    return f"gateway-ledger: {first}"


def operator() -> str:
    """Who runs this command: the OS user's name (``-`` when it cannot be told)."""
    try:
        return getpass.getuser()
    except Exception:  # no name for this uid (a container), no environment
        return "-"


def invalid_argument(argv: Sequence[str]) -> str | None:
    """An argument that is not valid UTF-8 (Python hands it over with lone surrogates)."""
    for position, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            return f"argument {position} is not valid UTF-8"
    return None


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get(DB_ENV, DEFAULT_DB),
        help=f"SQLite file or postgresql:// URL (default: ${DB_ENV} or {DEFAULT_DB})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    arguments = list(sys.argv[1:] if argv is None else argv)
    invalid = invalid_argument(arguments)
    if invalid is not None:
        print(f"gateway-ledger: {invalid}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.global_db is not None and hasattr(args, "db"):
        args.db = args.global_db  # `gateway-ledger --db X status` means the same as `status --db X`
    style = os.environ.get(FORMAT_ENV, "text").strip().lower() or "text"
    if style not in FORMATS:
        print(
            f"gateway-ledger: {FORMAT_ENV}={style!r}: one of {', '.join(FORMATS)}", file=sys.stderr
        )
        return 2
    if style == "text":
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s %(message)s",
        )
    else:
        handler = logging.StreamHandler()
        handler.addFilter(ContextIds())
        handler.setFormatter(StructuredFormatter(style))
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler]
        )
    try:
        # Whatever the command writes was caused by it, run by this OS user (ADR 0058).
        with causes.caused_by(f"operator:{args.command}:{operator()}", causes.new_id()):
            return int(args.handler(args) or 0)
    except BrokenPipeError:
        return 0
    except EXPECTED_FAILURES as e:
        print(failure_line(e), file=sys.stderr)
        return 2
    except Exception as e:  # the last line of defence: still one line, the rest with -v
        logging.getLogger("gateway_ledger.cli").info("unexpected failure", exc_info=True)
        print(f"{failure_line(e)} (unexpected; run with -v for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
