"""``gateway-ledger sweep [--dry-run]``: what a boot sweep would claim, or claim it."""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from gateway_ledger.application.sweep_preview import preview_sweep
from gateway_ledger.entrypoints.console import add_common, open_ledger, print_json, table


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sweep",
        help="run (or, with --dry-run, preview) the recovery sweep",
        description="Claims the unresolved obligations whose owner is dead and abandons the "
        "stale or exhausted ones. Claims made here are owned by this short-lived process, "
        "so a gateway's next sweep claims them again to send them (each claim counts "
        "toward max_attempts): use --dry-run to look, and a real sweep mainly to abandon.",
    )
    parser.add_argument("--dry-run", action="store_true", help="decide, append nothing")
    parser.add_argument(
        "--platform",
        action="append",
        metavar="P",
        help="only platforms that are connected (repeat; default: every platform)",
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def _counts(result: Any) -> list[list[Any]]:
    return [
        ["candidates", result.candidates],
        ["claimed", result.claimed],
        ["abandoned", result.abandoned_total],
        ["skipped: owner alive", result.skipped_alive],
        ["skipped: platform offline", result.skipped_offline],
        ["lost races", result.lost_races],
        ["errors", result.errors],
    ]


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    if args.dry_run:
        preview = preview_sweep(ledger, deliverable_platforms=args.platform)
        if args.json:
            print_json(preview.to_dict())
            return 0
        print("sweep --dry-run: nothing was appended")
        rows = [
            [a.obligation_id, a.platform, a.action, a.reason, a.needs_marker, a.recovery_attempt]
            for a in preview.actions
        ]
        print(table(["obligation", "platform", "would", "reason", "marker", "attempt"], rows))
        print()
        print(table(["", "count"], _counts(preview.result)))
        return 0
    won = ledger.sweep_recoverable(deliverable_platforms=args.platform)
    result = ledger.last_sweep
    assert result is not None
    if args.json:
        print_json(
            {
                "dry_run": False,
                "result": attrs.asdict(result),
                "claimed": [
                    {k: w[k] for k in ("obligation_id", "platform", "needs_marker", "attempts")}
                    for w in won
                ],
            }
        )
        return 0
    rows = [[w["obligation_id"], w["platform"], w["needs_marker"], w["attempts"]] for w in won]
    print(table(["claimed", "platform", "marker", "attempt"], rows))
    print()
    print(table(["", "count"], _counts(result)))
    return 0
