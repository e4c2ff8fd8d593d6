"""What a record costs the broker when records arrive spread out, by how many
partitions its consumer reads.

Records that arrive one every few ms go one per produce request, and each
wakes its consumer's waiting fetch: a produce and a fetch round trip per
record. librdkafka (confluent-kafka) fetches without sessions (it does not
implement KIP-227), so every fetch names all of the consumer's partitions on
the broker, which reads, meters and answers each of them: the cost per record
grows with the consumer's partition count. The dispatcher consumes every
tenant's run topic (8 partitions each); bench_firing_steady.py's reader, 10
tenants' 80 partitions, has the broker at 50-65% of a core at 1,000 records/s.

Cases: one consumer of 8, 80 and 400 partitions (1, 10 and 50 topics), then
the 400 shared by 4 consumers of one group (as 4 dispatcher instances would).
In each, a producer sends RATE records/s spread evenly, round-robin over the
partitions, for SECONDS; printed: the broker's CPU (share of one core, and
per record), fetch requests per second (the consumers' librdkafka
statistics), and produce -> consumed latency p50/p99.

No target: it sizes the broker and the dispatcher (docs/architecture.md,
"The broker's cost per record").
"""

from __future__ import annotations

import json
import threading
import time
import uuid

from common import (
    cpu_seconds,
    delete_topics,
    describe,
    grant,
    header,
    kafka_broker_pid,
    machine_load,
    observer_group,
    say,
    topics_ready,
)
from confluent_kafka import TopicPartition

from cronwheel import kafka
from cronwheel.core.clock import now_ms

RATE = 500  # records per second, spread evenly
SECONDS = 15
WARMUP_S = 3
PARTITIONS = 8  # per topic, as a tenant's run topic has


class Consumer:
    """One consumer of the case's group on its own thread; notes each record's
    produce -> consumed latency and its fetch requests (librdkafka statistics)."""

    def __init__(self, group: str, topics: list[str], members: int, index: int):
        self.latency: list[float] = []
        self.fetches = 0
        self._stop = threading.Event()
        self.consumer = kafka.consumer(
            group,
            principal="observer",
            **{"statistics.interval.ms": 1000, "stats_cb": self._stats},
        )
        parts = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        # Assigned, not subscribed: the group's split is fixed, no rebalance mid-case.
        self.consumer.assign(parts[index::members])
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _stats(self, raw: str) -> None:
        stats = json.loads(raw)
        self.fetches = sum(
            b["req"].get("Fetch", 0) for b in stats["brokers"].values() if b["nodeid"] >= 0
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            m = self.consumer.poll(0.1)
            if m is None or m.error():
                continue
            self.latency.append(now_ms() - int(m.value()))

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(5)
        self.consumer.close()


def case(label: str, topics_n: int, members: int) -> None:
    prefix = f"benchfan{uuid.uuid4().hex[:8]}"
    # Run topics of the case's own prefix, as the platform's roles use them:
    # created by the dispatcher, written by the relay, read by the observer.
    topics = [f"{prefix}.runs.t{i}" for i in range(topics_n)]
    grant(prefix)
    kafka.ensure_topics(topics, partitions=PARTITIONS, principal="dispatcher")
    topics_ready(kafka.admin(principal="observer"), topics)  # records sent before would wait
    targets = [(t, p) for t in topics for p in range(PARTITIONS)]
    group = observer_group(prefix)
    broker = kafka_broker_pid()
    producer = kafka.producer(principal="relay", **{"linger.ms": 1})
    consumers = [Consumer(group, topics, members, i) for i in range(members)]
    try:
        for c in consumers:
            c.__enter__()
        step = 1 / RATE
        sent = 0
        start = time.monotonic()
        measured_from = start + WARMUP_S
        cpu0 = fetch0 = None
        i = 0
        while (now := time.monotonic()) < measured_from + SECONDS:
            if cpu0 is None and now >= measured_from:
                cpu0 = cpu_seconds(broker) if broker else 0.0
                fetch0 = sum(c.fetches for c in consumers)
                for c in consumers:
                    c.latency.clear()
                sent = 0
            topic, partition = targets[i % len(targets)]
            producer.produce(topic, str(now_ms()).encode(), partition=partition)
            producer.poll(0)
            i += 1
            sent += 1
            time.sleep(max(0.0, start + i * step - time.monotonic()))  # the pace itself
        cpu = (cpu_seconds(broker) if broker else 0.0) - cpu0
        producer.flush(10)
        time.sleep(1.5)  # the last records consumed, and one more statistics report
        fetches = sum(c.fetches for c in consumers) - fetch0
    finally:
        for c in consumers:
            c.__exit__(None, None, None)
        delete_topics(topics)
    latency = [x for c in consumers for x in c.latency]
    say(
        f"{label}: {topics_n * PARTITIONS} partitions, {members} consumer(s) of"
        f" {topics_n * PARTITIONS // members} each; {sent:,} records at {RATE}/s:"
        f" broker {100 * cpu / SECONDS:.0f}% of a core, {1000 * cpu / max(sent, 1):.2f} ms"
        f" per record; {fetches / SECONDS:,.0f} fetch requests/s;"
        f" produce -> consumed {describe(latency)}"
    )


def main() -> None:
    header("bench_fetch_fanout: the broker's cost per record by a consumer's partitions")
    say(f"machine: {machine_load()}")
    case("one consumer", 1, 1)
    case("one consumer", 10, 1)
    case("one consumer", 50, 1)
    case("four consumers", 50, 4)
    say(f"machine after: {machine_load()}")


if __name__ == "__main__":
    main()
