"""``gateway-ledger metrics``: the figures of ``status`` as Prometheus text exposition."""

from __future__ import annotations

import argparse
import sys

from gateway_ledger import bootstrap
from gateway_ledger.application.delivery.metrics import prometheus_text, retention_text
from gateway_ledger.entrypoints.console import Subcommands, add_common, open_ledger


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="Prometheus text exposition of the status figures (stable metric names)",
    )
    add_common(parser, json=False)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    sys.stdout.write(prometheus_text(ledger.stats()))
    extra = bootstrap.retention_status(ledger)
    dead = extra["dead_letters"]
    sys.stdout.write(
        retention_text(dead["count"], dead["oldest_age_seconds"], extra.get("pruned", 0))
    )
    return 0
