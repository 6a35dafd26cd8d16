"""``gateway-ledger sweep [--abandon-stale]``: what a boot sweep would do; never a claim.

The console script has no platform adapters, so it cannot send what it would claim: a
claim made here would only spend one of the reply's recovery attempts (a few runs from
cron would abandon a never-sent reply as ``max_attempts``). So a plain ``sweep`` is a
preview, and ``--abandon-stale`` appends only the sweep's abandons (ADR 0029).
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway_ledger.application.delivery.sweep_preview import abandon_stale, preview_sweep
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    print_json,
    table,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="preview the recovery sweep; --abandon-stale abandons what is stale or exhausted",
        description="Shows what a gateway's recovery sweep would do now: claim the "
        "unresolved obligations whose owner is dead, abandon the stale or exhausted ones. "
        "Nothing is appended and no recovery attempt is spent: claiming stays with the "
        "gateways, which can send what they claim. --abandon-stale appends the abandons "
        "(reason stale or max_attempts, by this process) and still claims nothing.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="the default; kept so existing scripts run unchanged",
    )
    mode.add_argument(
        "--abandon-stale",
        action="store_true",
        help="abandon, on the record, the orphans that are stale or over max_attempts",
    )
    parser.add_argument(
        "--platform",
        action="append",
        metavar="P",
        help="only platforms that are connected (repeat; default: every platform)",
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def _counts(result: Any, *, preview: bool, left: int | None = None) -> list[list[Any]]:
    """``left``: what an abandon-only run left for a gateway to claim (it claims none)."""
    would = "would " if preview else ""
    return [
        ["candidates", result.candidates],
        [f"{would}claim (left for a gateway)", result.claimed if left is None else left],
        [f"{would}abandon" if preview else "abandoned", result.abandoned_total],
        ["skipped: owner alive", result.skipped_alive],
        ["skipped: platform offline", result.skipped_offline],
        ["lost races", result.lost_races],
        ["errors", result.errors],
    ]


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db, writing=args.abandon_stale)
    if args.abandon_stale:
        return _abandon(args, ledger)
    preview = preview_sweep(ledger, deliverable_platforms=args.platform, liveness=ledger.liveness)
    if args.json:
        print_json(preview.to_dict())
        return 0
    print("sweep (preview): nothing was appended; a gateway's own sweep claims and sends")
    rows = [
        [a.obligation_id, a.platform, a.action, a.reason, a.needs_marker, a.recovery_attempt]
        for a in preview.actions
    ]
    print(table(["obligation", "platform", "would", "reason", "marker", "attempt"], rows))
    print()
    print(table(["", "count"], _counts(preview.result, preview=True)))
    return 0


def _abandon(args: argparse.Namespace, ledger: Any) -> int:
    report = abandon_stale(ledger, deliverable_platforms=args.platform, liveness=ledger.liveness)
    if args.json:
        print_json(report.to_dict())
        return 0
    rows = [[a.obligation_id, a.platform, a.reason] for a in report.abandoned]
    print(table(["abandoned", "platform", "reason"], rows))
    print()
    left = [[a.obligation_id, a.platform, a.needs_marker] for a in report.left_for_gateways]
    print(table(["left for a gateway", "platform", "marker"], left))
    print()
    left_count = len(report.left_for_gateways)
    print(table(["", "count"], _counts(report.result, preview=False, left=left_count)))
    return 0
