"""A writer process timing its writes while another process erases a session
(run by test_erasure_availability.py).

``python tests/erasure_writer_child.py LOCATION STOP_FILE``: records replies for an
unrelated session through the synchronous API, one after another, until STOP_FILE
exists. Prints ``ready`` after its first write, then one JSON line at the end:
``{"writes": n, "max_wait": seconds, "errors": [names]}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gateway_ledger.bootstrap import DeliveryLedger


def main(location: str, stop_file: str) -> None:
    ledger = DeliveryLedger.open(location)
    waits: list[float] = []
    errors: list[str] = []
    n = 0
    while True:
        n += 1
        started = time.monotonic()
        try:
            ledger.record_obligation(
                obligation_id=f"o-writer-{n}",
                session_key="agent:main:telegram:dm:bystander",
                platform="telegram",
                chat_id="bystander",
                content=f"reply {n}",
            )
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        waits.append(time.monotonic() - started)
        if n == 1:
            print("ready", flush=True)
        if Path(stop_file).exists():
            break
        time.sleep(0.01)
    ledger.close()
    print(json.dumps({"writes": n, "max_wait": max(waits), "errors": errors}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
