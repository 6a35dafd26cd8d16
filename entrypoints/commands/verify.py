"""``gateway-ledger verify``: is the store whole? Exit 1 on any problem.

SQLite's ``integrity_check``; every stream's versions 1..n without a gap; every event
decodable by this release; each view equal to a rebuild from the log (a differing view
is repaired, and still reported).
"""

from __future__ import annotations

import argparse

from gateway_ledger import bootstrap
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    print_json,
    table,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="integrity check: pages, contiguous streams, decodable events, views (exit 1)",
        description="Checks the store without changing an event. Exit 1 when a check fails.",
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    try:
        report = bootstrap.verify_ledger_store(ledger)
    finally:
        ledger.close()
    if args.json:
        print_json(report.to_dict())
        return 0 if report.ok else 1
    print(f"gateway-ledger verify ({args.db}): {report.events_checked} events decoded")
    print(f"  integrity: {'ok' if not report.integrity else '; '.join(report.integrity[:5])}")
    print(f"  streams with a version gap: {len(report.broken_streams)}")
    for aggregate_id, n, first, last in report.broken_streams:
        print(f"    {aggregate_id}: {n} events, versions {first}..{last}")
    print(f"  undecodable events: {report.undecodable_count}")
    for aggregate_id, version, topic, reason in report.undecodable:
        print(f"    {aggregate_id} v{version} {topic}: {reason}")
    if report.views:
        rows = [[n, "yes" if e else "NO (repaired)", r] for n, e, r in report.views]
        print(table(["view", "equals rebuild", "rows"], rows, indent="  "))
    else:
        print("  views: not compared (store opened read-only)")
    print("OK" if report.ok else "PROBLEMS FOUND")
    return 0 if report.ok else 1
