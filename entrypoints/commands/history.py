"""``gateway-ledger history ID [--at T]``: every event of one obligation, or its past state."""

from __future__ import annotations

import argparse
from typing import Any

from gateway_ledger import bootstrap
from gateway_ledger.application.observability.correlation import correlated
from gateway_ledger.bootstrap import open_session_store
from gateway_ledger.domain.errors import LedgerError, NotFound
from gateway_ledger.entrypoints.console import (
    Subcommands,
    add_common,
    open_ledger,
    parse_moment,
    print_json,
    table,
    usage_error,
)


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser(
        "history",
        help="the timeline of one obligation; --at shows its state at a past moment",
        description="Every event: who, when, attempt, error class, marker, receipt.",
    )
    parser.add_argument("obligation_id", metavar="ID", nargs="?")
    parser.add_argument(
        "--correlation",
        metavar="CID",
        help="instead: every obligation and session event of one turn (a correlation id)",
    )
    parser.add_argument(
        "--at", metavar="T", help="replay only to T (ISO 8601, or an age: 15m, 2h, 3d)"
    )
    parser.add_argument(
        "--archive", metavar="FILE", help="read a pruned obligation from this archive (prune)"
    )
    add_common(parser)
    parser.set_defaults(handler=run)


def _who(fields: dict[str, Any]) -> str:
    owner = fields.get("by") or fields.get("owner")
    if owner is None:
        return "-"
    return f"{owner.host}:{owner.pid}"


def _facts(kind: str, f: dict[str, Any]) -> str:
    facts = []
    if "fence" in f:
        facts.append(f"fence={f['fence']}")
    if kind == "Attempting" and f.get("guard") is not None:
        facts.append(f"guard={f['guard']}")
    if kind == "Claimed":
        facts.append(f"attempt={f.get('recovery_attempt')} marker={f.get('needs_marker')}")
    if kind == "Failed":
        retry = f.get("retry_after")
        wait = "-" if retry is None else f"{retry:.1f}s"
        facts.append(f"class={f.get('classification')} retry_after={wait}")
    if kind in ("Delivered", "PartDelivered"):
        facts.append(f"receipt={len(f.get('receipt') or [])} id(s)")
    if kind == "Abandoned":
        facts.append(f"reason={f.get('reason')} class={f.get('error_class') or '-'}")
    if kind == "Quarantined":
        facts.append(f"reason={f.get('reason')} found_at=v{f.get('found_at')}")
    if kind in ("RetryRequested", "DeadLetterRetried"):
        facts.append(f"by operator {f.get('requested_by') or '?'}")
    if kind == "Imported":
        facts.append(
            f"from {f.get('source')}: state={f.get('source_state')} "
            f"attempts={f.get('attempts')} possibly_sent={f.get('possibly_sent')}"
        )
    if kind == "Recorded":
        facts.append(f"platform={f['target'].platform}")
    if kind == "Reconciled":
        part = "" if f.get("part") is None else f" part={f['part']}"
        facts.append(f"outcome={f.get('outcome')}{part} ids={len(f.get('message_ids') or [])}")
        if f.get("completes"):
            facts.append("settled")
    if kind == "StatusReported":
        facts.append(f"status={f.get('status')}")
        if f.get("part") is not None:
            facts.append(f"part={f['part']}")
    return " ".join(facts)


def _cause(meta: dict[str, str]) -> str:
    if not meta:
        return "-"
    trace = meta.get("trace_id")
    return meta.get("causation_id", "-") + (f" trace={trace}" if trace else "")


def run_correlation(args: argparse.Namespace) -> int:
    if args.obligation_id or args.at:
        raise usage_error("--correlation takes no obligation ID and no --at")
    ledger = open_ledger(args.db)
    stores: list[tuple[str, object, str]] = [("ledger", ledger, "gateway_ledger.domain.delivery")]
    sessions = open_session_store(args.db)
    if sessions is not None:
        stores.append(("sessions", sessions, "gateway_ledger.domain.sessions"))
    events = correlated(stores, args.correlation, whole_aggregates=["ledger"])
    if args.json:
        print_json({"correlation_id": args.correlation, "events": [e.to_dict() for e in events]})
        return 0
    if not events:
        print(f"no event of correlation {args.correlation}")
        return 1
    print(f"correlation {args.correlation}: {len(events)} event(s)")
    rows = [
        [e.store, e.name, e.version, e.timestamp, e.type, _cause(e.meta), "" if e.direct else "*"]
        for e in events
    ]
    print(table(["store", "id", "v", "when (UTC)", "event", "cause", ""], rows, indent="  "))
    if any(not e.direct for e in events):
        print("  * another event of an obligation of this turn (its own cause above)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.correlation is not None:
        return run_correlation(args)
    if not args.obligation_id:
        raise usage_error("history needs an obligation ID, or --correlation CID")
    at = parse_moment(args.at, name="--at") if args.at else None
    return show(
        open_ledger(args.db), args.obligation_id, at=at, archive=args.archive, as_json=args.json
    )


def show(
    ledger: Any,
    obligation_id: str,
    *,
    at: Any = None,
    archive: str | None = None,
    as_json: bool = False,
) -> int:
    """One obligation's history (or its past state ``at``), from the store or ``archive``;
    also ``dead-letters show``."""
    if archive:
        timeline = bootstrap.archived_timeline(ledger, obligation_id, archive, at)
    else:
        try:
            timeline = ledger.timeline(obligation_id, at)
        except NotFound:
            stone = ledger.tombstone(obligation_id)
            if stone is None:
                raise
            where = (
                f"read it with --archive {stone.archive}"
                if stone.archive
                else f"its events were not archived; it kept: {stone.send_attempts} send(s), "
                f"error class {stone.error_class or '-'}, reason {stone.abandon_reason or '-'}, "
                f"recorded {stone.recorded_at.isoformat()}, "
                f"resolved {stone.resolved_at.isoformat()}"
            )
            raise LedgerError(
                f"obligation {obligation_id} was {stone.state} and pruned at "
                f"{stone.pruned_at.isoformat()}; {where}"
            ) from None
    if as_json:
        print_json(timeline.to_dict())
        return 0
    status = timeline.status
    when = f" as of {at.isoformat()}" if at else ""
    quarantined = f" (QUARANTINED: {status.quarantine_reason})" if status.quarantine_reason else ""
    seen = f" ({status.platform_status})" if status.platform_status else ""
    print(f"obligation {timeline.obligation_id}{when}: {status.state}{seen}{quarantined}")
    print(
        f"  sends {status.send_attempts}, recovery claims {status.recovery_attempts}, "
        f"fence {status.fence}, marker {'yes' if status.needs_marker else 'no'}"
    )
    print()
    rows = [
        [e.version, e.timestamp, e.type, _who(e.fields), _facts(e.type, e.fields), _cause(e.meta)]
        for e in timeline.entries
    ]
    print(table(["v", "when (UTC)", "event", "by", "facts", "cause"], rows, indent="  "))
    turns = sorted({e.meta["correlation_id"] for e in timeline.entries if e.meta})
    if turns:
        print(f"  correlation: {', '.join(turns)} (history --correlation ID shows a whole turn)")
    if timeline.later_events:
        print(f"  ({timeline.later_events} later event(s) not shown)")
    return 0
