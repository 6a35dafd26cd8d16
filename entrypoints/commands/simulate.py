"""``gateway-ledger simulate``: a realistic, crash-filled run anyone can start with no set-up.

Gateway worker processes deliver replies to simulated platforms (latency, transient
errors, rate limits, dead chats, one platform with native idempotency), are killed with
SIGKILL at random moments and restarted, while extra gateways sweep the same store. The
report is counted from the ledger and from what the platforms actually received.
"""

from __future__ import annotations

import argparse
import json
import sys

from gateway_ledger.infrastructure.simulation.driver import Report, Simulation, SimulationConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate", help="crash-test the delivery path: kill gateways, count what users got"
    )
    parser.add_argument("--seed", type=int, default=1, help="workload and fault schedule")
    parser.add_argument("--conversations", type=int, default=120)
    parser.add_argument("--turns", type=int, default=4, help="replies per conversation")
    parser.add_argument("--workers", type=int, default=3, help="gateway processes")
    parser.add_argument("--kills", type=int, default=8, help="SIGKILLs during the run")
    parser.add_argument("--db", help="SQLite file to keep the store in (default: temporary)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = SimulationConfig(
        seed=args.seed,
        conversations=args.conversations,
        turns=args.turns,
        workers=args.workers,
        kills=args.kills,
        db=args.db,
    )
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
        ("deduplicated by platform", report.deduplicated_by_platform),
        ("abandoned", abandoned),
        ("unresolved", report.unresolved),
        ("lost", report.lost),
        ("unlabelled duplicates", report.unlabelled_duplicates),
        ("audit of the ledger's history", audit_line(report)),
        ("messages received", report.messages_received),
        ("gateways killed (SIGKILL)", report.kills),
        ("sweeping gateways started", report.sweeper_runs),
        ("ledger faults", report.ledger_faults),
        ("gateway processes that failed", report.gateway_failures),
        ("throughput", f"{report.obligations_per_second} obligations/s in {report.seconds} s"),
        ("store", report.db),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"gateway-ledger simulate (seed {report.seed})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print(
        "OK: nothing lost, no unlabelled duplicate, and the history agrees"
        if report.ok
        else "FAILED"
    )
    return 0 if report.ok else 1


def audit_line(report: Report) -> str:
    """The audit's problem counts (all 0 when the history explains every send) and its
    labelled possible duplicates, which the platforms saw as marked or deduplicated."""
    problems = sum(report.audit_problems.values())
    found = ", ".join(f"{k} {v}" for k, v in report.audit_problems.items() if v)
    return (
        f"{problems} problems{f' ({found})' if found else ''},"
        f" {report.audit_labelled_duplicates} labelled possible duplicates"
    )
