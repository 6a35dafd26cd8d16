"""``gateway-ledger abandon ID --reason TEXT``: stop owing a reply, on the record."""

from __future__ import annotations

import argparse

from gateway_ledger.domain.values import AbandonReason
from gateway_ledger.entrypoints.console import Subcommands, add_common, open_ledger, print_json


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "abandon",
        help="abandon an unresolved obligation (reason: operator; refused when final)",
    )
    parser.add_argument("obligation_id", metavar="ID")
    parser.add_argument(
        "--reason", required=True, metavar="TEXT", help="why (kept, encrypted, in the event)"
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db, writing=True)
    ledger.abandon(args.obligation_id, AbandonReason.OPERATOR, detail=args.reason)
    if args.json:
        print_json(
            {
                "obligation_id": args.obligation_id,
                "state": "abandoned",
                "abandon_reason": AbandonReason.OPERATOR.value,
            }
        )
        return 0
    print(f"obligation {args.obligation_id}: abandoned (reason operator)")
    return 0
