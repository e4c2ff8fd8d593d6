"""An SDK worker process for the e2e tests: `python -m tests.support.sdk_worker TOPIC`.

Its handler is idempotent the way a team would write one: the effect is keyed by
run_id (INSERT ... ON CONFLICT DO NOTHING), and every execution is also counted
so a test can see re-executions after crashes. Payload {"fail": "retry"|"fatal"}
and {"sleep_s": x} steer it.
"""

from __future__ import annotations

import os
import sys
import time

import psycopg

from cronwheel.sdk import Fail, Run, Worker

DSN = os.environ["EFFECTS_DSN"]


def handle(run: Run) -> dict:
    payload = run.payload if isinstance(run.payload, dict) else {}
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sdk_executions (run_id, attempt) VALUES (%s, %s)",
            [run.run_id, run.attempt],
        )
        if payload.get("sleep_s"):
            time.sleep(float(payload["sleep_s"]))  # the work itself
        if payload.get("fail") == "fatal":
            raise Fail("refused by the handler", retryable=False)
        if payload.get("fail") == "retry" and run.attempt == 1:
            raise RuntimeError("transient")
        conn.execute(
            "INSERT INTO sdk_effects (run_id) VALUES (%s) ON CONFLICT DO NOTHING", [run.run_id]
        )
    return {"attempt": run.attempt}


if __name__ == "__main__":
    Worker(sys.argv[1], handle, concurrency=int(os.environ.get("SDK_CONCURRENCY", "4")),
           drain_seconds=float(os.environ.get("SDK_DRAIN_S", "10"))).run()  # fmt: skip
