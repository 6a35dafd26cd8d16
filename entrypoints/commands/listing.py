"""``gateway-ledger list``: obligations from the index, filtered, oldest first."""

from __future__ import annotations

import argparse

from gateway_ledger.application.delivery.operations import STATES
from gateway_ledger.domain.delivery.reconciliation import PlatformStatus
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    parse_moment,
    print_json,
    table,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "list",
        help="list obligations (by state, platform, age, session)",
        description="Obligations from the obligation index, oldest first. No personal data "
        "is shown: a session appears as its keyed subject id.",
    )
    parser.add_argument("--state", choices=STATES, help="only this state")
    parser.add_argument("--platform", help="only this platform")
    parser.add_argument(
        "--status",
        choices=[s.value for s in PlatformStatus],
        help="only those whose platform last reported this status (e.g. read)",
    )
    parser.add_argument(
        "--since", metavar="T", help="recorded at or after T (ISO 8601, or an age: 15m, 2h, 3d)"
    )
    parser.add_argument("--session", metavar="KEY", help="only this session key's obligations")
    parser.add_argument("--limit", type=int, default=100, help="at most N rows (default 100)")
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    since = parse_moment(args.since, name="--since") if args.since else None
    if args.limit < 0:
        from gateway_ledger.entrypoints.console import usage_error

        raise usage_error("--limit must be 0 or more")
    ledger = open_ledger(args.db)
    entries = ledger.list(
        state=args.state,
        platform=args.platform,
        since=since,
        session=args.session,
        limit=args.limit,
        status=args.status,
    )
    if args.json:
        print_json({"obligations": [e.to_dict() for e in entries], "count": len(entries)})
        return 0
    rows = [
        [
            e.obligation_id,
            e.state if e.platform_status is None else f"{e.state} ({e.platform_status})",
            e.platform,
            e.recorded_at,
            e.send_attempts,
            e.claims,
            e.needs_marker,
            e.quarantine_reason or e.abandon_reason or e.error_class,
        ]
        for e in entries
    ]
    headers = ["obligation", "state", "platform", "recorded", "sends", "claims", "marker", "why"]
    print(table(headers, rows))
    if len(entries) == args.limit:
        print(f"(first {args.limit} shown; use --limit)")
    return 0
