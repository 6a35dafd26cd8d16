"""``gateway-ledger retry ID``: an operator asks for another try (a RetryRequested event)."""

from __future__ import annotations

import argparse
import os

from gateway_ledger.entrypoints.console import Subcommands, add_common, open_ledger, print_json


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "retry",
        help="make an unresolved obligation claimable by the next sweep (refused when final)",
        description="Appends RetryRequested: the operator becomes the owner (the previous one "
        "is fenced out), the recovery budget starts again, the marker flag is kept. Any "
        "gateway's next sweep claims it and sends it.",
    )
    parser.add_argument("obligation_id", metavar="ID")
    parser.add_argument(
        "--by", default=os.environ.get("USER", ""), help="operator name kept in the event"
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    status = open_ledger(args.db, writing=True).retry(args.obligation_id, args.by)
    if args.json:
        print_json(
            {
                "obligation_id": status.obligation_id,
                "state": status.state,
                "fence": status.fence,
                "needs_marker": status.needs_marker,
            }
        )
        return 0
    print(
        f"obligation {status.obligation_id}: retry requested (now {status.state}, "
        f"fence {status.fence}, marker {'yes' if status.needs_marker else 'no'}); "
        "the next sweep claims it"
    )
    return 0
