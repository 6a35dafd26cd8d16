"""``gateway-ledger projections status | rebuild [--name N] | follow [--interval S] [--for S]``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

from gateway_ledger.domain.errors import LedgerError
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    print_json,
    print_json_line,
    progress_bar,
    table,
)
from gateway_ledger.infrastructure.views.follower import ViewFollower
from gateway_ledger.projections.delivery.catalog import (
    PROJECTION_NAMES,
    projection_status,
    rebuild_and_verify,
)
from gateway_ledger.projections.follower import FollowStats


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser("projections", help="the read models: position, lag, rebuild")
    nested = parser.add_subparsers(dest="projections_command", metavar="SUBCOMMAND")
    nested.required = True
    status = nested.add_parser("status", help="position, lag and rows of each projection")
    add_common(status)
    status.set_defaults(handler=run_status)
    rebuild = nested.add_parser(
        "rebuild",
        help="rebuild from scratch and prove it equals the incremental view",
        description="Replays the log into a shadow copy up to the live view's position and "
        "compares them row by row; on a difference the live view is rebuilt (exit 1).",
    )
    rebuild.add_argument("--name", choices=PROJECTION_NAMES, help="one projection (default: all)")
    add_common(rebuild)
    rebuild.set_defaults(handler=run_rebuild)
    follow = nested.add_parser(
        "follow",
        help="keep every projection current as events land, until stopped",
        description="Catches the projections up after every commit: woken by NOTIFY on "
        "PostgreSQL, polling on SQLite. Prints a line per catch-up that applied events "
        "(counts only) and a summary on SIGINT or SIGTERM.",
    )
    follow.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between catch-ups without news (default: 5 on PostgreSQL, 0.5 on SQLite)",
    )
    follow.add_argument(
        "--for", dest="duration", type=float, default=None, help="stop after this many seconds"
    )
    add_common(follow)
    follow.set_defaults(handler=run_follow)


def run_status(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db)
    found = [projection_status(ledger, name) for name in PROJECTION_NAMES]
    newest = ledger.recorder.max_notification_id() or 0
    if args.json:
        print_json({"log_position": newest, "projections": [p.to_dict() for p in found]})
        return 0
    print(f"event log position: {newest}")
    print(
        table(
            ["projection", "position", "lag", "rows"],
            [[p.name, p.position, p.lag, p.rows] for p in found],
        )
    )
    return 0


def run_rebuild(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db, writing=True)
    names = [args.name] if args.name else list(PROJECTION_NAMES)
    reports = []
    for name in names:
        bar = None if args.json else progress_bar(f"rebuild {name}")
        reports.append(rebuild_and_verify(ledger, name, progress=bar))
    ok = all(r.equal for r in reports)
    if args.json:
        print_json({"ok": ok, "projections": [r.to_dict() for r in reports]})
        return 0 if ok else 1
    rows = [
        [r.name, r.position, r.events_replayed, r.rows, r.equal, r.repaired, r.elapsed_seconds]
        for r in reports
    ]
    print(table(["projection", "position", "replayed", "rows", "equal", "repaired", "s"], rows))
    for r in reports:
        for d in r.differences:
            print(f"  {r.name}: {d}")
    print("OK: every rebuild equals its incremental view" if ok else "DIFFERENCES FOUND")
    return 0 if ok else 1


def run_follow(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.db, writing=True)
    try:
        follower = ViewFollower(ledger, interval=args.interval)
    except LedgerError:
        ledger.close()
        raise

    def stop(_signum: int, _frame: FrameType | None) -> None:
        follower.stop(timeout=0)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)

    def report(applied: dict[str, int], stats: FollowStats) -> None:
        if args.json:
            print_json_line({"applied": applied, "position": stats.position})
        else:
            counts = ", ".join(f"{name} {count}" for name, count in applied.items())
            now = time.strftime("%H:%M:%S", time.gmtime())
            print(f"{now} applied {counts} (position {stats.position})")
        sys.stdout.flush()

    try:
        stats = follower.run(duration=args.duration, on_applied=report)
    finally:
        ledger.close()
    if args.json:
        print_json_line({"stopped": True, **stats.to_dict()})
    else:
        total = sum(stats.applied.values())
        print(
            f"stopped: {stats.catch_ups} catch-ups, {stats.notified} woken by the store,"
            f" {total} events applied, {stats.errors} errors, position {stats.position}"
        )
    return 0 if stats.errors == 0 else 1
