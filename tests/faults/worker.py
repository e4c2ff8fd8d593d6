"""The fault harness's SDK worker: `python -m tests.faults.worker TOPIC`.

Every execution of its handler appends two lines to the JSON-lines file
EFFECT_LOG: {"run", "attempt", "phase": "start"} when it begins and
{"phase": "effect"} when its effect is done, with no deduplication, so the
checker counts every re-execution and every doubled effect. The log is a local
file, not a table: the database is one of the servers the harness crashes, and
an effect log that lost rows with it would hide the very faults it counts.
"""

from __future__ import annotations

import json
import os
import sys
import time

from cronwheel.sdk import Run, Worker

_LOG = os.open(os.environ["EFFECT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _record(run: Run, phase: str) -> None:
    line = json.dumps({"run": run.run_id, "attempt": run.attempt, "phase": phase})
    os.write(_LOG, (line + "\n").encode())  # one write, O_APPEND: lines never interleave


def handle(run: Run) -> dict:
    _record(run, "start")
    payload = run.payload if isinstance(run.payload, dict) else {}
    time.sleep(float(payload.get("sleep_s", 0)))  # the work itself: keeps calls in flight
    _record(run, "effect")
    return {"attempt": run.attempt}


if __name__ == "__main__":
    Worker(sys.argv[1], handle, concurrency=int(os.environ.get("SDK_CONCURRENCY", "8"))).run()
