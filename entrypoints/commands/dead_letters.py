"""``gateway-ledger dead-letters [show ID | prune --reason R --older-than T]``.

Dead letters are the replies the ledger gave up on (abandoned) or cannot read
(quarantined). The list groups them by state, reason, platform and age; ``show`` is one
of them with its history; ``prune`` drops the content of those abandoned for a reason,
older than an age, and keeps their audit facts (a tombstone: ids, error class, attempts,
times); ``retry ID --by NAME`` sends an abandoned one again, on the record.
"""

from __future__ import annotations

import argparse
import os

from gateway_ledger import bootstrap
from gateway_ledger.application.delivery.dead_letters import dead_letter_groups, retry_dead_letter
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    parse_age,
    print_json,
    table,
    usage_error,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "dead-letters",
        help="abandoned and quarantined replies by reason, platform and age; show, retry, prune",
    )
    add_common(parser)
    parser.set_defaults(handler=run_list)
    nested = parser.add_subparsers(dest="dead_letters_command", metavar="SUBCOMMAND")
    listing = nested.add_parser("list", help="the groups, and with --all every dead letter")
    listing.add_argument("--all", action="store_true", help="every dead letter, oldest first")
    add_common(listing)
    listing.set_defaults(handler=run_list)
    show = nested.add_parser("show", help="one dead letter: its facts and its history")
    show.add_argument("obligation_id", metavar="ID")
    add_common(show)
    show.set_defaults(handler=run_show)
    retry = nested.add_parser(
        "retry",
        help="send an abandoned reply again, on the record (by whom)",
        description="Appends DeadLetterRetried: owed again, the operator its owner; any "
        "gateway's next sweep sends it (labelled if an earlier send may have arrived).",
    )
    retry.add_argument("obligation_id", metavar="ID")
    retry.add_argument(
        "--by", default=os.environ.get("USER", ""), help="operator name kept in the event"
    )
    add_common(retry)
    retry.set_defaults(handler=run_retry)
    prune = nested.add_parser(
        "prune",
        help="drop the content of dead letters abandoned for REASON older than AGE",
        description="Their audit facts stay (a tombstone); with --archive their events are "
        "archived first. Quarantined ones are never pruned.",
    )
    prune.add_argument("--reason", required=True, help="the abandon reason (e.g. dead_target)")
    prune.add_argument("--older-than", required=True, metavar="AGE")
    prune.add_argument("--archive", metavar="FILE", help="archive their events first")
    prune.add_argument("--dry-run", action="store_true")
    add_common(prune)
    prune.set_defaults(handler=run_prune)


def run_list(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    try:
        ledger.obligation_index.catch_up()
        rows = bootstrap.dead_letters_of(ledger).rows()
        now = ledger.clock()
    finally:
        ledger.close()
    groups = dead_letter_groups(rows, now)
    every = getattr(args, "all", False)
    if args.json:
        data: dict[str, object] = {
            "count": len(rows),
            "groups": [g.to_dict() for g in groups],
        }
        if every:
            data["dead_letters"] = rows
        print_json(data)
        return 0
    print(f"dead letters: {len(rows)}")
    if groups:
        print(
            table(
                ["state", "reason", "platform", "age", "count", "oldest (UTC)"],
                [[g.state, g.reason, g.platform, g.age, g.count, g.oldest] for g in groups],
                indent="  ",
            )
        )
    if every and rows:
        print()
        print(
            table(
                ["obligation", "state", "reason", "platform", "sends", "error", "since (UTC)"],
                [
                    [
                        r["obligation_id"],
                        r["state"],
                        r["reason"],
                        r["platform"],
                        r["send_attempts"],
                        r["error_class"],
                        r["last_transition_at"],
                    ]
                    for r in rows
                ],
                indent="  ",
            )
        )
    return 0


def run_show(args: argparse.Namespace) -> int:
    from gateway_ledger.entrypoints.commands import history

    return history.show(open_ledger(args.db), args.obligation_id, as_json=args.json)


def run_retry(args: argparse.Namespace) -> int:
    if not args.by.strip():
        raise usage_error("dead-letters retry needs --by NAME (who asked, on the record)")
    ledger = open_ledger(args.db, writing=True)
    try:
        status = retry_dead_letter(ledger, args.obligation_id, args.by)
    finally:
        ledger.close()
    if args.json:
        print_json(status.to_dict())
        return 0
    print(
        f"dead letter {args.obligation_id} retried by {args.by}: {status.state}, the next "
        "sweep of any gateway sends it"
    )
    return 0


def run_prune(args: argparse.Namespace) -> int:
    age = parse_age(args.older_than, name="--older-than")
    ledger = open_ledger(args.db, writing=not args.dry_run)
    try:
        report = ledger.prune(
            age, archive=args.archive or "", dry_run=args.dry_run, reason=args.reason
        )
    finally:
        ledger.close()
    if args.json:
        print_json(report.to_dict())
        return 0
    verb = "would drop" if report.dry_run else "dropped"
    count = report.candidates if report.dry_run else report.pruned
    kept = f"archived in {args.archive}" if args.archive else "their content is gone"
    print(
        f"dead letters abandoned for {args.reason} before {report.cutoff.isoformat()}: "
        f"{verb} {count}; their audit facts stay (tombstones), {kept}"
    )
    return 0
