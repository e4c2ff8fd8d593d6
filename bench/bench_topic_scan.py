"""What one scan of the cluster's topics (`list_topics()`, the topic watch's
broker scan every 30 s, cronwheel.topic_watch) costs the client that makes
it, by what that client has met: librdkafka matches each topic of a
metadata answer against the topics the client knows by walking them all
(`rd_kafka_topic_metadata_update2` -> `rd_kafka_topic_find`), so a scan
costs the answer's topics times the client's. With `--topics` (3,000)
one-partition topics on the broker, the scan asked through:

- a fresh admin client (it knows no topic);
- an admin client that asked each topic's metadata by name, as
  `kafka.ensure_topics` does while waiting for a new topic's leader;
- a producer that wrote a record to each, as the dispatcher's producer
  meets every tenant's queue topic.

Printed per client: this process's CPU per scan (CLOCK_PROCESS_CPUTIME_ID:
librdkafka's threads and Python's) and its wall time, the median of
`--scans` (9), the clients alternating.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import delete_topics, header, machine_load, make_run_topics, say

from cronwheel import kafka


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=3000)
    parser.add_argument("--scans", type=int, default=9)
    args = parser.parse_args()
    header("bench_topic_scan: a scan of the cluster's topics, by what the client has met")
    topics = make_run_topics(args.topics)
    try:
        fresh = kafka.admin(principal="dispatcher")
        named = kafka.admin(principal="dispatcher")
        for t in topics:
            named.list_topics(t, timeout=10)
        producer = kafka.producer(principal="relay")
        for t in topics:
            producer.produce(t, b"x")
            producer.poll(0)
        left = producer.flush(60)
        if left:
            say(f"{left} records undelivered after 60 s")
        clients = {
            "a fresh admin client": fresh,
            f"an admin client that named each of the {len(topics)}": named,
            f"a producer that wrote to each of the {len(topics)}": producer,
        }
        cpu: dict[str, list[float]] = {k: [] for k in clients}
        wall: dict[str, list[float]] = {k: [] for k in clients}
        seen: dict[str, int] = {}
        for _ in range(args.scans):
            for what, client in clients.items():
                c0, w0 = time.process_time(), time.monotonic()
                seen[what] = len(client.list_topics(timeout=30).topics)
                cpu[what].append(time.process_time() - c0)
                wall[what].append(time.monotonic() - w0)
        for what in clients:
            say(
                f"RESULT a scan of {seen[what]} topics through {what}: "
                f"CPU {statistics.median(cpu[what]) * 1000:.1f} ms, "
                f"wall {statistics.median(wall[what]) * 1000:.1f} ms (median of {args.scans})"
            )
        say(f"load after: {machine_load()}")
    finally:
        delete_topics(topics)


if __name__ == "__main__":
    main()
