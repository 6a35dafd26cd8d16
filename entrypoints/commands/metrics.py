"""``gateway-ledger metrics``: the ledger's Prometheus metrics, through ``prometheus-client``.

Printed once (the text exposition format), or served for a sidecar deployment with
``--serve [HOST]:PORT`` until SIGINT or SIGTERM; each scrape reads the views (ADR 0057).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from gateway_ledger.entrypoints.console import Subcommands, add_common, open_ledger, usage_error
from gateway_ledger.infrastructure.observability.prometheus import LedgerCollector


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="Prometheus metrics of the ledger (stable names); --serve for a scrape endpoint",
    )
    add_common(parser, json=False)
    parser.add_argument(
        "--serve",
        metavar="[HOST]:PORT",
        help="serve /metrics on this address until stopped (e.g. :9464) instead of printing",
    )
    parser.set_defaults(handler=run)


def address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise usage_error(f"--serve: {text!r} is not [HOST]:PORT (e.g. :9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


def run(args: argparse.Namespace) -> int:
    serve = None if args.serve is None else address(args.serve)
    ledger = open_ledger(args.db)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(ledger))
    if serve is None:
        sys.stdout.write(generate_latest(registry).decode())
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server, thread = start_http_server(serve[1], addr=serve[0], registry=registry)
    sys.stderr.write(f"serving metrics on http://{serve[0]}:{server.server_port}/metrics\n")
    sys.stderr.flush()
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    ledger.close()
    return 0
