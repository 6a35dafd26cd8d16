"""Import benchmark: a hermes installation of 10,000 sessions x 50 messages and 10,000
owed replies, imported into a new store (target: under a minute on the reference machine).

Measured in one run: reading the installation alone (the baseline: what any importer
must do), then the whole import (read, seal, write); the ratio says what the writing
costs on top of the reading. A second import of the same installation measures the
idempotent re-run (it reads everything and writes nothing).

    python benchmarks/hermes_import.py [--sessions N] [--messages M] [--obligations K]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.hermes_fixture

from gateway_ledger.entrypoints.hermes_import import import_hermes
from gateway_ledger.infrastructure.importing.hermes import read_installation
from tests.hermes_fixture import Installation, bulk

TARGET_SECONDS = 60.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--obligations", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "hermes"
        started = time.perf_counter()
        inst = Installation(home)
        bulk(inst, args.sessions, args.messages, args.obligations, time.time() - 3600)
        inst.close()
        print(
            f"installation: {args.sessions} sessions x {args.messages} messages, "
            f"{args.obligations} obligations (built in {time.perf_counter() - started:.1f} s)"
        )
        started = time.perf_counter()
        found = read_installation(home)
        read = time.perf_counter() - started
        assert len(found.keys) == args.sessions and not found.problems, found.problems[:3]
        db = str(Path(tmp) / "ledger.db")
        started, cpu = time.perf_counter(), time.process_time()
        report = import_hermes(home, db=db, secret_dir=tmp)
        whole, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert report.keys_imported == args.sessions, report.summary()
        assert report.obligations_imported == args.obligations, report.summary()
        started = time.perf_counter()
        again = import_hermes(home, db=db, secret_dir=tmp)
        rerun = time.perf_counter() - started
        assert again.nothing_new
        total = args.sessions * args.messages
        print(f"read the installation (baseline): {read:8.1f} s")
        print(f"import (read + seal + write):     {whole:8.1f} s  = {whole / read:.1f}x the read")
        print(f"  {total / whole:,.0f} messages/s; {report.messages_imported} messages written")
        print(f"  CPU time of this process: {cpu:.1f} s (the rest is waiting for the machine)")
        print(f"second run (nothing new):         {rerun:8.1f} s  = {rerun / read:.1f}x the read")
        verdict = "met" if whole < TARGET_SECONDS else "NOT met"
        print(f"target: import under {TARGET_SECONDS:.0f} s: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
