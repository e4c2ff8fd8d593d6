"""What the dispatcher adds to a run's way when the system is quiet: one
RunReady at a time, produced to a tenant's run topic every 50 ms, timed from
its produce() to readable on the queue topic (the dispatcher's consume, the
`processed` lookup and insert, its produce and the acknowledgement it waits
for, two broker round trips).

The dispatcher runs in this process, on its thread (the measuring loop sleeps
between records); the database is a fresh one, the topics this run's own.
No target: bench_lifecycle.py measures dispatch under load; this one shows
the floor. Of it, 5 ms is the batching window (`max_wait_ms`) that a lone
record waits out: `consume(batch - 1, timeout)` waits for a full batch. Taking
only what is fetched already halved the p50 here (10 -> 5 ms), but it is not
in: it makes smaller batches under a herd, and bench_storm.py's critical p99
was not shown to hold with it.

Usage: bench_dispatch_quiet.py [--records N]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

from common import (
    delete_topics,
    describe,
    fresh_database,
    grant,
    header,
    machine_load,
    observer_group,
    prefix_topics,
    say,
)
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import config, kafka
from cronwheel.core import events
from cronwheel.kafka import Topics
from services.dispatcher.service import Dispatcher

GAP_S = 0.05


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200)
    args = ap.parse_args()
    header("bench_dispatch_quiet: one RunReady every 50 ms through the dispatcher")
    bootstrap = config.kafka_bootstrap()
    topics = Topics(f"bench{uuid.uuid4().hex[:8]}")
    grant(topics.prefix)
    tenant = "ten_quiet"
    source, dest = topics.runs(tenant), topics.queue(tenant, "q")
    # As the platform's roles: the dispatcher creates the topics, the relay
    # writes the run topic, the observer reads the queue topic.
    kafka.ensure_topics([source, dest], bootstrap=bootstrap, principal="dispatcher")
    reader = kafka.consumer(observer_group(), bootstrap, principal="observer")
    parts = reader.list_topics(dest, timeout=10).topics[dest].partitions
    reader.assign([TopicPartition(dest, p, OFFSET_BEGINNING) for p in parts])
    producer = kafka.producer(bootstrap, principal="relay", **{"linger.ms": 0})
    latencies: list[float] = []
    with fresh_database() as url:
        stop = threading.Event()
        dispatcher = Dispatcher(url, bootstrap, topics)
        thread = threading.Thread(target=dispatcher.run, args=(stop,), daemon=True)
        thread.start()
        try:
            for i in range(-20, args.records):  # the first 20 warm the path up
                run_id = f"run{i + 20:05d}{uuid.uuid4().hex[:24]}"
                value = events.run_ready(
                    run_id=run_id, tenant_id=tenant, partition_id=7, attempt=1,
                    scheduled_ms=1_700_000_000_000, created_ms=1_700_000_000_000,
                    priority="normal", payload="{}", target={"type": "queue", "queue": "q"},
                )  # fmt: skip
                t0 = time.perf_counter()
                producer.produce(source, key=run_id.encode(), value=value)
                producer.flush(10)
                deadline = t0 + 10
                while time.perf_counter() < deadline:
                    m = reader.poll(1)
                    if m is not None and m.error() is None and m.key() == run_id.encode():
                        if i >= 0:
                            latencies.append(1000 * (time.perf_counter() - t0))
                        break
                time.sleep(GAP_S)
        finally:
            stop.set()
            thread.join(30)
            reader.close()
            if mine := prefix_topics(topics.prefix):
                delete_topics(mine)
    say(f"machine: {machine_load()}")
    say(
        f"quiet dispatch: {len(latencies)} of {args.records} records, produce() -> readable on"
        f" the queue topic: {describe(latencies)}"
    )


if __name__ == "__main__":
    main()
