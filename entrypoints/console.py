"""Shared by the operators' commands: opening the store, tables, JSON, times, progress.

Human output is an aligned table on stdout; ``--json`` prints one JSON document with
stable field names; a progress bar goes to stderr, and only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import orjson

from gateway_ledger import bootstrap
from gateway_ledger.bootstrap import DeliveryLedger

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The type of ``add_subparsers()``; argparse exports it under an underscored name only,
so this module is the one that names it."""


def usage_error(message: str) -> Exception:
    from gateway_ledger.entrypoints.cli import UsageError

    return UsageError(message)


def add_common(parser: argparse.ArgumentParser, *, json: bool = True) -> None:
    from gateway_ledger.entrypoints.cli import add_db_option

    add_db_option(parser)
    if json:
        parser.add_argument("--json", action="store_true", help="print JSON (stable field names)")


def open_ledger(location: str, *, writing: bool = False) -> DeliveryLedger:
    """The ledger of an existing store: read-only when this process may not write it,
    unless the command appends (``writing``), which is then refused."""
    return bootstrap.open_ledger(location, existing=True, writing=writing)


def parse_moment(text: str, *, name: str) -> datetime:
    """ISO 8601 (naive means UTC) or an age such as ``90s``, ``15m``, ``2h``, ``3d`` (ago)."""
    match = _RELATIVE.match(text.strip())
    if match:
        amount, unit = float(match.group(1)), _UNITS[match.group(2)]
        try:
            return datetime.now(UTC) - timedelta(**{unit: amount})
        except OverflowError:
            raise usage_error(f"{name}: {text!r} reaches before the year 1") from None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise usage_error(
            f"{name}: {text!r} is neither an ISO 8601 time nor an age like 15m, 2h, 3d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_age(text: str, *, name: str) -> timedelta:
    """An age such as ``0s``, ``90s``, ``15m``, ``2h``, ``30d``."""
    match = _RELATIVE.match(text.strip())
    if not match:
        raise usage_error(f"{name}: {text!r} is not an age like 0s, 15m, 2h, 30d")
    amount, unit = float(match.group(1)), _UNITS[match.group(2)]
    try:
        return timedelta(**{unit: amount})
    except OverflowError:
        raise usage_error(f"{name}: {text!r} is too long an age") from None


def print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def print_json_line(data: Any) -> None:
    """One JSON object per line, for streams a machine reads as they come."""
    sys.stdout.write(orjson.dumps(data, default=str).decode() + "\n")


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "") -> str:
    """Columns aligned on the widest cell; numeric columns right-aligned."""
    raw = [list(row) for row in rows]
    cells = [[cell(v) for v in row] for row in raw]

    def is_number(v: Any) -> bool:
        return v is None or (isinstance(v, int | float) and not isinstance(v, bool))

    numeric = [bool(raw) and all(is_number(r[i]) for r in raw) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if numeric[i] else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return (indent + "  ".join(parts)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def progress_bar(label: str) -> Callable[[int, int], None] | None:
    """A progress callback drawing on stderr when it is a terminal; None when piped."""
    if not sys.stderr.isatty():
        return None

    def draw(done: int, total: int) -> None:
        total = max(total, 1)
        share = min(1.0, done / total)
        filled = int(share * 30)
        bar = "#" * filled + "." * (30 - filled)
        sys.stderr.write(f"\r{label} [{bar}] {share:6.1%} {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return draw
