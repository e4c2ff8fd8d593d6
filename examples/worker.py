"""An example worker: consumes the demo queue that `make run` prints and
completes every run, failing retryably when the payload asks for it.

    pip install cronwheel        # the SDK alone: confluent-kafka and fastavro
    CRONWHEEL_URL=http://127.0.0.1:8080 CRONWHEEL_API_KEY=cw_... \
    CRONWHEEL_KAFKA_USERNAME=tenant-<tenant_id> CRONWHEEL_KAFKA_PASSWORD=... \
    python examples/worker.py cw.q.<tenant_id>.demo

`make run` prints the demo tenant's key and Kafka credentials; a tenant made
with `POST /v1/tenants` gets its own in that answer (`kafka`), once.
(KAFKA_BOOTSTRAP names the broker where it is not the local stack's;
CRONWHEEL_KAFKA_SECURITY_PROTOCOL=SASL_SSL and CRONWHEEL_KAFKA_CA_FILE for TLS.)
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
