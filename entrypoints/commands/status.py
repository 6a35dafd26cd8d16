"""``gateway-ledger status``: what is owed, how old, how fast deliveries go, view lag."""

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
        "status",
        help="obligations by state and platform, oldest unresolved, delivery times, lag",
        description="Figures from the obligation index (no history replay).",
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    stats = ledger.stats()
    extra = bootstrap.retention_status(ledger)
    pacing = bootstrap.pacing_status(ledger)
    if args.json:
        print_json({**stats.to_dict(), **extra, "pacing": pacing})
        return 0
    states = list(stats.by_state)
    print(f"gateway-ledger status ({args.db})")
    print(f"  obligations: {stats.total}, unresolved: {stats.unresolved}")
    if "pruned" in extra:
        print(f"  pruned (tombstones stay; gateway-ledger prune): {extra['pruned']}")
    dead = extra["dead_letters"]
    if dead["count"]:
        print(
            f"  dead letters: {dead['count']}, oldest {dead['oldest_age_seconds']:.0f} s old "
            "(gateway-ledger dead-letters)"
        )
    if stats.quarantined:
        shown = ", ".join(stats.quarantined_ids[:10])
        more = stats.quarantined - min(10, len(stats.quarantined_ids))
        print(
            f"  QUARANTINED: {stats.quarantined} (unreadable events: never sent, never counted "
            f"as delivered; gateway-ledger list --state quarantined): {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    if stats.oldest_unresolved_id is not None:
        print(
            f"  oldest unresolved: {stats.oldest_unresolved_id} "
            f"({stats.oldest_unresolved_age_seconds:.0f} s old)"
        )
    print()
    rows = [
        [p, *(per[s] for s in states), sum(per.values())] for p, per in stats.by_platform.items()
    ]
    rows.append(["all", *(stats.by_state[s] for s in states), stats.total])
    print(table(["platform", *states, "total"], rows, indent="  "))
    times = stats.delivery_seconds
    print()
    print(
        table(
            ["record to delivery", "count", "p50 s", "p95 s", "max s"],
            [["", times.count, times.p50, times.p95, times.max]],
            indent="  ",
        )
    )
    print()
    reasons = [[r, n] for r, n in stats.abandoned_by_reason.items()]
    print(table(["abandoned by reason", "count"], reasons, indent="  "))
    print()
    print(
        f"  recovery claims: {stats.recovery_claims} "
        f"(on {stats.obligations_claimed} obligations), operator retries: {stats.operator_retries}"
    )
    seen = ", ".join(f"{s} {n}" for s, n in stats.by_platform_status.items())
    print(
        f"  platform statuses: {seen}; failed after acceptance (reopened):"
        f" {stats.failed_after_acceptance}"
    )
    print()
    waiting = [[p, f["count"], f["oldest_age_seconds"]] for p, f in pacing["queued"].items()]
    print(table(["recorded, not yet sent", "count", "oldest s"], waiting, indent="  "))
    pauses = ", ".join(f"{p} {s:.1f} s" for p, s in pacing["pauses"].items()) or "none"
    sharing = ", ".join(f"{p} {n}" for p, n in pacing["sharing"].items()) or "none"
    print(f"  bot pauses in force: {pauses}; gateways sharing a bot's budget: {sharing}")
    print()
    views = [[p.name, p.position, p.lag, p.rows] for p in stats.projections]
    print(table(["projection", "position", "lag", "rows"], views, indent="  "))
    return 0
