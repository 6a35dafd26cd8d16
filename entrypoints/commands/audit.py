"""``gateway-ledger audit duplicates``: replay every event, report who may have got a reply twice.

Exit 1 when a problem is found (an unmarked re-send, a double claim, a claim from a live
owner, a late result); with ``--strict`` also when a labelled possible duplicate is.
"""

from __future__ import annotations

import argparse

from gateway_ledger import bootstrap
from gateway_ledger.application.delivery.audit import audit_duplicates
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    print_json,
    progress_bar,
    table,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser("audit", help="checks that replay the whole event log")
    nested = parser.add_subparsers(dest="audit_command", metavar="CHECK")
    nested.required = True
    dup = nested.add_parser(
        "duplicates",
        help="obligations that may have reached a user more than once, and why",
        description="Replays every event. Problems (exit 1): unmarked_resend, double_claim, "
        "claim_from_live_owner, late_result. Possible duplicates whose re-sends all carried "
        "the marker are listed but are not problems unless --strict.",
    )
    dup.add_argument("--strict", action="store_true", help="labelled duplicates fail too")
    dup.add_argument("--all", action="store_true", help="list every possible duplicate")
    dup.add_argument(
        "--archive", metavar="FILE", help="also replay the pruned obligations archived here"
    )
    add_common(dup)
    dup.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    archived = bootstrap.archived_events(ledger, args.archive) if args.archive else ()
    report = audit_duplicates(
        ledger, progress=None if args.json else progress_bar("audit"), archived=archived
    )
    failed = not report.ok or (args.strict and bool(report.possible_duplicates))
    pruned = ledger.retention.tombstone_count()
    covers = (
        None
        if not pruned and not args.archive
        else {"live_store": True, "archive": args.archive, "pruned_obligations": pruned}
    )
    if args.json:
        print_json(report.to_dict() if covers is None else {**report.to_dict(), "covers": covers})
        return 1 if failed else 0
    if covers is not None:
        print(
            f"covers: the live store and {args.archive}"
            if args.archive
            else f"covers: the live store only; {pruned} pruned obligation(s) are not "
            "replayed (give --archive FILE)"
        )
    print(
        f"audit duplicates: {report.events_scanned} events, {report.obligations} obligations, "
        f"{report.elapsed_seconds:.2f} s"
    )
    counts = report.counts()
    rows = [[kind, n] for kind, n in counts.items()]
    rows.append(["possible duplicates (labelled)", report.labelled_duplicates])
    rows.append(["possible duplicates (unlabelled)", report.unlabelled_duplicates])
    rows.append(["possible duplicates avoided by reconciliation", report.avoided_duplicates])
    for outcome, n in report.reconciled.items():
        rows.append([f"reconciled {outcome}", n])
    print(table(["finding", "count"], rows, indent="  "))
    if report.findings:
        print()
        found = [[f.kind, f.obligation_id, f.version, f.detail] for f in report.findings]
        print(table(["problem", "obligation", "v", "detail"], found, indent="  "))
    shown = report.possible_duplicates if args.all else report.possible_duplicates[:20]
    if shown:
        print()
        dups = [
            [d.obligation_id, d.sends, d.labelled, " ".join(map(str, d.send_versions)), d.state]
            for d in shown
        ]
        print(
            table(
                ["possible duplicate", "sends", "labelled", "send versions", "state"],
                dups,
                indent="  ",
            )
        )
        if len(shown) < len(report.possible_duplicates):
            print(f"  ({len(report.possible_duplicates) - len(shown)} more; use --all)")
    print()
    print("PROBLEMS FOUND" if failed else "OK: no unmarked re-send, double claim or late result")
    return 1 if failed else 0
