"""``gateway-ledger simulate``: a realistic, crash-filled run anyone can start with no set-up.

Gateway worker processes deliver replies to simulated platforms (latency, transient
errors, rate limits, dead chats, one platform with native idempotency), are killed with
SIGKILL at random moments and restarted, while extra gateways sweep the same store. The
report is counted from the ledger and from what the platforms actually received.

Simulated platforms declare rate limits and enforce them (one bans the bot after
repeated violations); the report counts replies users got out of order, the violations,
the bans and the delay pacing added (ADR 0065). ``--backlog N`` first has a gateway
record N replies unsent and killed, so the workers' boot sweeps recover them at once.

``--faults`` adds a poisoned store, erasures mid-run and, on PostgreSQL, a gateway paused
past its lease (``entrypoints/simulation/faults.py``); the verdict then also needs
no erased placeholder sent and every obligation accounted for.
"""

from __future__ import annotations

import argparse
import json
import sys

from gateway_ledger.bootstrap import open_ledger
from gateway_ledger.domain.errors import NotAStore
from gateway_ledger.entrypoints.console import Subcommands
from gateway_ledger.entrypoints.simulation.driver import Simulation
from gateway_ledger.entrypoints.simulation.report import FaultReport, Report, SimulationConfig


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "simulate", help="crash-test the delivery path: kill gateways, count what users got"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload and fault schedule")
    parser.add_argument("--conversations", type=int, default=120)
    parser.add_argument("--turns", type=int, default=4, help="replies per conversation")
    parser.add_argument("--workers", type=int, default=3, help="gateway processes")
    parser.add_argument("--kills", type=int, default=8, help="SIGKILLs during the run")
    parser.add_argument(
        "--db",
        help="SQLite file or postgresql:// URL to keep the store in (default: temporary file)",
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="also poison stored events, forget sessions mid-run and (PostgreSQL) pause a gateway",
    )
    parser.add_argument(
        "--no-reconcile",
        dest="reconcile",
        action="store_false",
        help="adapters never ask the platform what arrived (compare with the same seed)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        metavar="N",
        help="first, a gateway records N replies to the conversations' first turns and is"
        " killed unsent: the workers' boot sweeps recover them all at once (adds"
        " conversations where needed so each keeps a live turn)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def events_held(location: str) -> int:
    """Events already in the store at ``location`` (0: none, or no store there yet). A
    run's verdict counts every obligation in its store: another run's would be judged
    lost or unaccounted for."""
    try:
        ledger = open_ledger(location, existing=True, check_key=False)
    except NotAStore:
        return 0
    try:
        return ledger.recorder.max_notification_id() or 0
    finally:
        ledger.close()


def run(args: argparse.Namespace) -> int:
    config = SimulationConfig(
        seed=args.seed,
        conversations=args.conversations,
        turns=args.turns,
        workers=args.workers,
        kills=args.kills,
        db=args.db,
        faults=args.faults,
        reconcile=args.reconcile,
        backlog=args.backlog,
    )
    if args.backlog < 0 or (args.backlog and args.turns < 2):
        print(
            "simulate: --backlog must not be negative, and needs --turns 2 or more (each"
            " conversation keeps a live turn after the backlog)",
            file=sys.stderr,
        )
        return 2
    held = events_held(args.db) if args.db else 0
    if held:
        print(
            f"simulate: the store at {args.db} already holds {held} event(s); a simulation"
            " judges a store of its own (give a new file, or a fresh ?schema=NAME)",
            file=sys.stderr,
        )
        return 2
    tty = sys.stderr.isatty()

    def progress(line: str) -> None:
        if tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)

    report = Simulation(config, progress=progress).run()
    if tty:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0 if report.ok else 1
    abandoned = ", ".join(f"{k} {v}" for k, v in report.abandoned.items()) or "none"
    rows = [
        ("obligations", report.obligations),
        ("delivered first time", report.delivered_first_time),
        ("redelivered with marker", report.redelivered_with_marker),
        ("redelivered plain", report.redelivered_plain),
        ("settled by reconciliation", report.settled_by_reconciliation),
        ("deduplicated by platform", report.deduplicated_by_platform),
        ("abandoned", abandoned),
        ("unresolved", report.unresolved),
        ("lost", report.lost),
        ("unlabelled duplicates", report.unlabelled_duplicates),
        ("audit of the ledger's history", audit_line(report)),
        *order_rows(report),
        *platform_rows(report),
        ("messages received", report.messages_received),
        ("gateways killed (SIGKILL)", report.kills),
        ("sweeping gateways started", report.sweeper_runs),
        ("ledger faults", report.ledger_faults),
        ("gateway processes that failed", report.gateway_failures),
        ("throughput", f"{report.obligations_per_second} obligations/s in {report.seconds} s"),
        ("store", report.db or "the run's own, removed"),
    ]
    if report.kept:
        rows.append(("kept for diagnosis", report.kept))
    if report.faults is not None:
        rows[-3:-3] = fault_rows(report.faults)
    width = max(len(name) for name, _ in rows)
    print(f"gateway-ledger simulate (seed {report.seed}{', faults' if report.faults else ''})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if not report.ok:
        print(f"FAILED: {', '.join(report.failed)}")
    elif report.faults is None:
        print(
            "OK: nothing lost, no unlabelled duplicate, nothing out of order, no rate limit"
            " exceeded, and the history agrees"
        )
    else:
        print(
            "OK: nothing lost, no unlabelled duplicate, nothing out of order, no rate limit"
            " exceeded, no erased reply sent, every obligation accounted for, and the"
            " history agrees"
        )
    return 0 if report.ok else 1


def fault_rows(f: FaultReport) -> list[tuple[str, object]]:
    """The planted faults and what they did, for the human report."""
    audit_error = [("audit failed", f.audit_error)] if f.audit_error else []
    return [
        (
            "poisoned (delivered before)",
            f"{f.poisoned} ({f.poisoned_when or 'not planted'}), re-sent"
            f" {f.poisoned_resent} message(s),"
            f" {f.poisoned_reported_by_audit} named by the audit",
        ),
        ("quarantined", f"{f.quarantined} ({f.quarantined_source})"),
        ("quarantined, not poisoned", f.quarantined_unplanted),
        (
            "sessions forgotten",
            f"{f.forgotten}, {f.forgotten_in_flight} reply(ies) in flight,"
            f" {f.forgotten_turns_unrecorded} turn(s) not recorded,"
            f" {f.recorded_after_erasure} recorded after the erasure;"
            f" took {', '.join(f'{t} s' for t in f.forget_seconds) or '-'}",
        ),
        ("erased abandoned", f.erased_abandoned),
        (
            "erased sent",
            f"{f.erased_sent} ({f.erased_sent_placeholder} with the placeholder,"
            f" {f.erased_sent_after_forget} taken from the store after the erasure)",
        ),
        *[("forget failed", e) for e in f.forget_errors],
        (
            "gateways paused (SIGSTOP)",
            f"{f.paused} for {f.paused_seconds} s, {f.paused_in_flight} reply(ies) in flight,"
            f" {f.paused_claimed} claimed by another gateway",
        ),
        ("paused gateway's late results", f.paused_late_results),
        ("late results (all)", f.late_results),
        ("audit findings the faults explain", sum(f.audit_explained.values())),
        *audit_error,
        (
            "unaccounted",
            f"{f.unaccounted}"
            + (f" ({', '.join(f.unaccounted_ids[:5])})" if f.unaccounted else ""),
        ),
    ]


def order_rows(report: Report) -> list[tuple[str, object]]:
    """Order and pacing (ADR 0065): what users saw, what the platforms refused."""
    released = ", ".join(f"{k} {v}" for k, v in report.order_released_by_reason.items())
    waited = ", ".join(f"{k} {v} s" for k, v in report.waited_seconds.items()) or "none"
    ids = f" ({', '.join(report.out_of_order_ids)})" if report.out_of_order else ""
    backlog = (
        [
            (
                "backlog recovered at boot",
                f"{report.backlog} recorded unsent, {report.recovered_unsent} recovered"
                f" and delivered; {report.conversations} conversations",
            )
        ]
        if report.backlog
        else []
    )
    return [
        *backlog,
        ("out of order", f"{report.out_of_order}{ids}"),
        ("out of order after a platform drop", report.out_of_order_after_drop),
        ("order released", f"{report.order_released}{f' ({released})' if released else ''}"),
        ("rate limit violations", report.rate_limit_violations),
        ("bans", report.bans),
        (
            "pacing",
            f"p95 {report.pacing_p95_seconds} s, max {report.pacing_max_seconds} s per reply;"
            f" {report.waits} waits ({waited})",
        ),
    ]


def platform_rows(report: Report) -> list[tuple[str, object]]:
    """Per platform: labelled possible duplicates and reconciliation's answers."""
    rows: list[tuple[str, object]] = []
    for name, p in report.platforms.items():
        rows.append(
            (
                f"{name} (reconciles: {p.reconciles})",
                f"{p.labelled_duplicates} labelled duplicates; reconciled"
                f" {p.reconciled_arrived} arrived, {p.reconciled_not_arrived} not arrived,"
                f" {p.reconciled_unknown} unknown; {p.failed_after_acceptance} failed after"
                f" acceptance; {sum(p.rate_limit_violations.values())} over its limits,"
                f" {p.bans} bans",
            )
        )
    rows.append(
        (
            "reconciliation round trips",
            f"{report.reconcile_round_trips} ({report.reconcile_lost_to_kills} answered to a"
            f" gateway killed before it recorded the answer,"
            f" {report.reconcile_unrecorded} unrecorded otherwise)",
        )
    )
    return rows


def audit_line(report: Report) -> str:
    """The audit's problem counts (all 0 when the history explains every send) and its
    labelled possible duplicates, which the platforms saw as marked or deduplicated."""
    problems = sum(report.audit_problems.values())
    found = ", ".join(f"{k} {v}" for k, v in report.audit_problems.items() if v)
    return (
        f"{problems} problems{f' ({found})' if found else ''},"
        f" {report.audit_labelled_duplicates} labelled possible duplicates"
    )
