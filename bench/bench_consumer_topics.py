"""What a consumer pays for the topics it knows, and whether splitting them
between clients in one process helps (issue 21: the dispatcher at 3,000
tenants). librdkafka finds the topic of each partition in a fetch response
by walking every topic the client knows, so a fetch response naming every
partition costs the tenants squared; several clients, each for a share of
the topics, walk a share each, but each brings its own threads and fetches.

One process reads, as the dispatcher does at the top of a minute: `--topics`
(3,000) topics of one partition, each getting one record per round
(`--every`, 10 s) from a producer in a child process, spread over
`--spread` (1 s) as the relay publishes each at its instant. Before
each round every partition is resumed (the wakes, 1 s ahead); once a
client has read its records, and 1 s more (`doze_after_ms`), it pauses all
of its partitions again (dozing). `--clients` K (1,3) clients in turn, each
assigned the topics whose name hashes to it and read by a thread of its
own. Printed per K: the reading process's CPU over `--rounds` (6) rounds
(CLOCK_PROCESS_CPUTIME_ID: every thread), and the records read.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
import zlib

from common import delete_topics, header, machine_load, make_run_topics, say
from confluent_kafka import OFFSET_END, TopicPartition

from cronwheel import kafka

WAKE_AHEAD_S = 1.0  # the relay's wake comes up to the fire-ahead lead before the record
DOZE_AFTER_S = 1.0  # the dispatcher's doze_after_ms
STALL_S = 20  # fresh partitions' one-time stall, 8-15 s after their first records


def _produce_rounds(
    topics: list[str], every_s: float, first_at: float, rounds: int, spread_s: float = 0.0
) -> None:
    """Each round, a record to every topic, spread over `spread_s` from the
    round's instant (the relay publishes each at its millisecond)."""
    producer = kafka.producer(principal="relay", **{"linger.ms": 1})
    for r in range(rounds):
        at = first_at + r * every_s
        for i, t in enumerate(topics):
            time.sleep(max(0.0, at + spread_s * i / len(topics) - time.time()))  # the pace
            producer.produce(t, key=b"k", value=b"x" * 200)
            producer.poll(0)
        producer.flush(30)


class Reader(threading.Thread):
    """One client and the thread that reads it: paused between rounds."""

    def __init__(self, topics: list[str], group: str):
        super().__init__(daemon=True)
        self.consumer = kafka.consumer(group, principal="dispatcher")
        self.tps = [TopicPartition(t, 0, OFFSET_END) for t in topics]
        self.consumer.assign(self.tps)
        self.consumer.pause(self.tps)
        self.expected = len(topics)
        self.read = 0
        self.round_read = 0
        self.awake_since_done: float | None = None
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if self.wake.is_set():
                    self.wake.clear()
                    self.round_read = 0
                    self.awake_since_done = None
                    self.consumer.resume(self.tps)
            msgs = self.consumer.consume(500, timeout=0.2)
            got = sum(1 for m in msgs if m.error() is None)
            self.read += got
            self.round_read += got
            now = time.monotonic()
            if self.round_read >= self.expected and self.awake_since_done is None:
                self.awake_since_done = now
            if self.awake_since_done is not None and now - self.awake_since_done >= DOZE_AFTER_S:
                self.consumer.pause(self.tps)
                self.awake_since_done = float("inf")  # asleep until the next wake
        self.consumer.close()


def measure(
    topics: list[str], clients: int, every_s: float, rounds: int, spread_s: float
) -> tuple[float, int]:
    shares: list[list[str]] = [[] for _ in range(clients)]
    for t in topics:
        shares[zlib.crc32(t.encode()) % clients].append(t)
    group = f"{topics[0].split('.')[0]}.dispatcher"
    readers = [Reader(share, group) for share in shares]
    for r in readers:
        r.start()
    time.sleep(5)  # the clients connected and the partitions' positions resolved
    first_at = time.time() + WAKE_AHEAD_S + 1
    child = multiprocessing.Process(
        target=_produce_rounds, args=(topics, every_s, first_at, rounds, spread_s), daemon=True
    )
    child.start()
    began_cpu, began = time.process_time(), time.monotonic()
    for r in range(rounds):
        time.sleep(max(0.0, first_at + r * every_s - WAKE_AHEAD_S - time.time()))  # the wake
        for reader in readers:
            with reader.lock:
                reader.wake.set()
    time.sleep(max(0.0, first_at + rounds * every_s - time.time()))  # the last round's end
    cpu = 100 * (time.process_time() - began_cpu) / (time.monotonic() - began)
    child.join(30)
    for reader in readers:
        reader.stop.set()
    for reader in readers:
        reader.join(30)
    return cpu, sum(r.read for r in readers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=3000)
    ap.add_argument("--clients", default="1,3")
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--spread", type=float, default=1.0, help="seconds a round's records span")
    args = ap.parse_args()
    header("bench_consumer_topics: a reading process's CPU against its clients' topics")
    topics = make_run_topics(args.topics)
    try:
        # A record each, and the broker's one-time stall of fresh partitions
        # (8-15 s after their first records) waited out before any window.
        _produce_rounds(topics, 0, time.time(), 1)
        time.sleep(STALL_S)
        for k in (int(x) for x in args.clients.split(",")):
            cpu, read = measure(topics, k, args.every, args.rounds, args.spread)
            say(
                f"{k} client(s), {len(topics):,} topics among them, a round every"
                f" {args.every:.0f} s: {cpu:.1f}% of a core; {read:,} of"
                f" {len(topics) * args.rounds:,} records read"
            )
        say(f"machine after: {machine_load()}")
    finally:
        delete_topics(topics)


if __name__ == "__main__":
    main()
