"""An example worker: consumes the demo queue that `make run` prints and
completes every run, failing retryably when the payload asks for it.

    pip install cronwheel        # the SDK alone: confluent-kafka and fastavro
    CRONWHEEL_URL=http://127.0.0.1:8080 CRONWHEEL_API_KEY=cw_... \
    python examples/worker.py cw.q.<tenant_id>.demo

(KAFKA_BOOTSTRAP names the broker where it is not the local stack's.)
"""

from __future__ import annotations

import logging
import sys

from cronwheel.sdk import Fail, Run, Worker


def handle(run: Run) -> dict:
    print(f"run {run.run_id} attempt {run.attempt} scheduled {run.scheduled_at}: {run.payload}")
    if isinstance(run.payload, dict) and run.payload.get("fail"):
        raise Fail("asked to fail", retryable=run.payload.get("retry", True))
    return {"handled_by": "examples/worker.py"}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    if len(sys.argv) != 2:
        sys.exit("usage: worker.py QUEUE_TOPIC")
    Worker(sys.argv[1], handle, concurrency=4).run()
