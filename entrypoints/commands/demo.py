"""``gateway-ledger demo``: record one reply, fail once, deliver it, print its history."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger
from gateway_ledger.domain.delivery.obligation import compute_obligation_id
from gateway_ledger.entrypoints.console import Subcommands


def register(subparsers: Subcommands) -> None:
    parser = subparsers.add_parser("demo", help="drive one obligation and print its history")
    parser.add_argument("--db", help="SQLite file to keep (default: a temporary file)")
    parser.add_argument("--json", action="store_true", help="print the history as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    db = args.db or str(Path(tempfile.mkdtemp(prefix="gateway-ledger-")) / "demo.db")
    ledger = DeliveryLedger.open(db)
    key = "agent:main:telegram:dm:demo"
    oid = compute_obligation_id(key, "inbound-1", "Hello from the agent")
    ledger.record_obligation(
        obligation_id=oid,
        session_key=key,
        platform="telegram",
        chat_id="demo",
        content="Hello from the agent",
    )
    ledger.mark_attempting(oid)
    ledger.mark_failed(oid, "HTTP 503 from the platform", "ambiguous")
    ledger.mark_attempting(oid)
    ledger.mark_delivered(oid, ["platform-msg-1"])
    history = [entry.to_dict() for entry in ledger.history(oid)]
    if args.json:
        print(json.dumps({"db": db, "obligation_id": oid, "history": history}, indent=2))
        return 0
    print(f"store: {db}\nobligation {oid}")
    for entry in history:
        print(f"  v{entry['version']}  {entry['timestamp']}  {entry['type']}")
    return 0
