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
the 400 shared by 4 consumers of one group (as 4 dispatcher instances would):
spread, each with 2 partitions of every topic, and by whole topics, 12 or 13
each (each fetch names every topic of its consumer, and the authorizer
checks each topic a request names).
In each, a producer sends RATE records/s spread evenly, round-robin over the
partitions, for SECONDS; printed: the broker's CPU (share of one core, and
per record), fetch requests per second (the consumers' librdkafka
statistics), and produce -> consumed latency p50/p99.

The measured window starts once every consumer has a record from each of
its partitions: before that, librdkafka looks up each new partition's start
(ListOffsets, answered "not leader" for some seconds after the topics are
made, then Metadata and again), 1,800-2,700 ListOffsets and 1,300-2,400
Metadata requests a case, which the fixed 3 s warm-up this bench had let
into the window of 11 of 12 runs (2026-12-03, counted over JMX). Printed
beside the figures: the clients' requests per second by type in the window
(librdkafka statistics), which show whether it was steady.

No target: it sizes the broker and the dispatcher (docs/architecture.md,
"The broker's cost per record"). `--case N` runs only case N (1-4).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections import Counter

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
STEADY_WITHIN_S = 60  # for every consumer to have a record of each of its partitions
PARTITIONS = 8  # per topic, as a tenant's run topic has


class Consumer:
    """One consumer of the case's group on its own thread; notes each record's
    produce -> consumed latency and its fetch requests (librdkafka statistics)."""

    def __init__(
        self, group: str, topics: list[str], members: int, index: int, by_topic: bool = False
    ):
        self.latency: list[float] = []
        self.requests: Counter = Counter()  # by type, since the start (statistics)
        self.seen: set[tuple[str, int]] = set()  # partitions a record came from
        self._stop = threading.Event()
        self.consumer = kafka.consumer(
            group,
            principal="observer",
            **{"statistics.interval.ms": 1000, "stats_cb": self._stats},
        )
        parts = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
        # Assigned, not subscribed: the group's split is fixed, no rebalance
        # mid-case. Spread, each member has partitions of every topic (as a
        # consumer group's range or round-robin assignment of many
        # topics gives them out); by topic, whole topics each.
        if by_topic:
            mine = set(topics[index::members])
            self.assigned = [tp for tp in parts if tp.topic in mine]
        else:
            self.assigned = parts[index::members]
        self.consumer.assign(self.assigned)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _stats(self, raw: str) -> None:
        self.requests = requests_of(raw)

    def steady(self) -> bool:
        return len(self.seen) == len(self.assigned)

    def _loop(self) -> None:
        while not self._stop.is_set():
            m = self.consumer.poll(0.1)
            if m is None or m.error():
                continue
            self.seen.add((m.topic(), m.partition()))
            self.latency.append(now_ms() - int(m.value()))

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(5)
        self.consumer.close()


def requests_of(raw: str) -> Counter:
    """A librdkafka statistics report's requests sent, by type, over its brokers."""
    out: Counter = Counter()
    for b in json.loads(raw)["brokers"].values():
        out.update({k: v for k, v in b["req"].items() if v})
    return out


def case(label: str, topics_n: int, members: int, by_topic: bool = False) -> None:
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
    produced: list[Counter] = [Counter()]

    def producer_stats(raw: str) -> None:
        produced[0] = requests_of(raw)

    producer = kafka.producer(
        principal="relay",
        **{"linger.ms": 1, "statistics.interval.ms": 1000, "stats_cb": producer_stats},
    )
    consumers = [Consumer(group, topics, members, i, by_topic) for i in range(members)]

    def counts() -> Counter:
        return sum((c.requests for c in consumers), Counter()) + produced[0]

    try:
        for c in consumers:
            c.__enter__()
        step = 1 / RATE
        start = time.monotonic()
        deadline = start + STEADY_WITHIN_S
        cpu0 = None
        measured_from = float("inf")
        i = sent = 0
        while cpu0 is None or time.monotonic() < measured_from + SECONDS:
            if cpu0 is None and all(c.steady() for c in consumers):
                measured_from = time.monotonic()
                cpu0 = cpu_seconds(broker) if broker else 0.0
                before = counts()  # statistics up to a second old: both ends alike
                for c in consumers:
                    c.latency.clear()
                sent = 0
            if cpu0 is None and time.monotonic() > deadline:
                raise RuntimeError(
                    f"{label}: no record from every partition in {STEADY_WITHIN_S} s"
                )
            topic, partition = targets[i % len(targets)]
            producer.produce(topic, str(now_ms()).encode(), partition=partition)
            producer.poll(0)
            i += 1
            sent += 1
            time.sleep(max(0.0, start + i * step - time.monotonic()))  # the pace itself
        cpu = (cpu_seconds(broker) if broker else 0.0) - cpu0
        after = counts()
        warmup_s = measured_from - start
        producer.flush(10)
        time.sleep(1.5)  # the last records consumed
    finally:
        for c in consumers:
            c.__exit__(None, None, None)
        delete_topics(topics)
    latency = [x for c in consumers for x in c.latency]
    per_s = {k: (after[k] - before[k]) / SECONDS for k in sorted(after) if after[k] > before[k]}
    rates = ", ".join(f"{k} {v:,.1f}" for k, v in per_s.items())
    say(
        f"{label}: {topics_n * PARTITIONS} partitions, {members} consumer(s) of"
        f" {topics_n * PARTITIONS // members} each; {sent:,} records at {RATE}/s"
        f" (steady after {warmup_s:.1f} s): broker {100 * cpu / SECONDS:.0f}% of a core,"
        f" {1000 * cpu / max(sent, 1):.2f} ms per record; produce -> consumed"
        f" {describe(latency)}; the clients' requests/s: {rates}"
    )


CASES = [("one consumer", 1, 1, False), ("one consumer", 10, 1, False),
         ("one consumer", 50, 1, False), ("four consumers", 50, 4, False),
         ("four consumers, whole topics each", 50, 4, True)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", type=int, choices=range(1, len(CASES) + 1), help="only this one")
    args = parser.parse_args()
    header("bench_fetch_fanout: the broker's cost per record by a consumer's partitions")
    say(f"machine: {machine_load()}")
    for n, (label, topics_n, members, by_topic) in enumerate(CASES, 1):
        if args.case in (None, n):
            case(label, topics_n, members, by_topic)
    say(f"machine after: {machine_load()}")


if __name__ == "__main__":
    main()
