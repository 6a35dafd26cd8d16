"""Rebuild a golden store on PostgreSQL from its committed rows (tests/golden/README.md).

    python tools/load_golden_store.py tests/golden/0.1.0-2026-12-01 'postgresql://...?schema=s'

Loads ``store.db`` into the schema of the URL and ``raw-keys.db`` into ``<schema>_raw``.
The rows are the ones the release wrote into SQLite, inserted unchanged into tables that
the code at hand creates: nothing is regenerated, so the answers prove the code reads what
the release wrote. Run the console script on the URL with GATEWAY_LEDGER_KEY_DIR and
GATEWAY_LEDGER_SECRET_DIR naming a directory holding the folder's master.key and
session-secret (mode 0600).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden_stores as gs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a release folder under tests/golden/")
    parser.add_argument("url", help="postgresql:// URL with ?schema= (a fresh schema)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    for store in gs.STORES:
        counts = gs.load_into_postgres(folder / gs.rows_file(store), gs.schema_url(args.url, store))
        print(f"{store}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
