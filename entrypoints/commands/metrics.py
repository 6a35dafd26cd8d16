"""``gateway-ledger metrics``: the figures of ``status`` as Prometheus text exposition."""

from __future__ import annotations

import argparse
import sys

from gateway_ledger.application.delivery.metrics import prometheus_text
from gateway_ledger.entrypoints.console import Subcommands, add_common, open_ledger


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="Prometheus text exposition of the status figures (stable metric names)",
    )
    add_common(parser, json=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(prometheus_text(open_ledger(args.db).stats()))
    return 0
