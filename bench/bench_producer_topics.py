"""What a producer pays for the topics it has known (issue 21: the relay at
3,000 tenants). librdkafka's broker thread walks every partition its
producer has met, each time it wakes (at the relay's linger of 1 ms, about
once per record at 1,000 records/s), whether the partition has records or
not; so a relay that has published to every tenant's run topic once pays
for all of them on every record of the few that are busy.

One process, no cronwheel service. `--busy` (10) topics take 1,000 records/s
spread over each second, 200 bytes each, as the relay's producer does
(cronwheel.kafka.producer, the relay's principal and linger); the process's
CPU (CLOCK_PROCESS_CPUTIME_ID: every thread, precise) over `--window` (20) s:

1. one producer that has only met the busy topics;
2. the same producer after one record to each of `--idle` (3,000) more
   topics, the broker's one-time stall of their fresh partitions waited out;
3. `--shards` (4) producers, each meeting the topics whose name hashes to
   it, busy and idle: the walk split that many ways, against each
   producer's own threads and timers;
4. the services' RenewingProducer (cronwheel/topics_met.py), looked at once
   a window: it meets the busy and idle topics (a look: all used), sends a
   window to the busy ones alone, and the look after it renews it (at
   least 500 met, at most half used); the next window is measured.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
import zlib

from common import create_topics, delete_topics, grant, header, machine_load, say

from cronwheel import kafka
from cronwheel.topics_met import RenewingProducer, TopicsMet

RATE = 1_000
STALL_S = 20  # fresh partitions' one-time stall, 8-15 s after their first records


def relays_producer():
    return kafka.producer(principal="relay", **{"linger.ms": 1})


class Shards:
    """Producers that each take the topics whose name hashes to them."""

    def __init__(self, n: int = 0, producers: list | None = None):
        self.producers = producers or [relays_producer() for _ in range(n)]

    def produce(self, topic: str, value: bytes) -> None:
        p = self.producers[zlib.crc32(topic.encode()) % len(self.producers)]
        p.produce(topic, key=b"bench", value=value)
        p.poll(0)

    def poll(self) -> None:
        for p in self.producers:
            p.poll(0)

    def flush(self) -> None:
        left = sum(p.flush(60) for p in self.producers)
        assert not left, f"{left} records not delivered"


def window(shards: Shards, busy: list[str], seconds: int) -> float:
    """Percent of one core the process used sending RATE records/s to `busy`."""
    began_cpu, began = time.process_time(), time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        wait = began + n / RATE - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        shards.produce(busy[n % len(busy)], b"x" * 200)
        shards.poll()
        n += 1
    shards.flush()
    return 100 * (time.process_time() - began_cpu) / seconds


def meet(shards: Shards, topics: list[str]) -> None:
    for topic in topics:
        shards.produce(topic, b"")
    shards.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=10)
    ap.add_argument("--idle", type=int, default=3000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--window", type=int, default=20)
    args = ap.parse_args()
    header("bench_producer_topics: a producer's CPU against the topics it has met")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    grant(prefix)
    busy = [f"{prefix}.runs.busy{i}" for i in range(args.busy)]
    idle = [f"{prefix}.runs.idle{i}" for i in range(args.idle)]
    try:
        create_topics(busy + idle)
        one = Shards(1)
        meet(one, busy)
        say(
            f"one producer, {len(busy)} topics met: {window(one, busy, args.window):.0f}% of a"
            f" core at {RATE:,} records/s"
        )
        meet(one, idle)
        time.sleep(STALL_S)
        for _ in range(2):
            say(
                f"one producer, {len(busy) + len(idle):,} topics met ({len(busy)} busy):"
                f" {window(one, busy, args.window):.0f}% of a core"
            )
        many = Shards(args.shards)
        meet(many, busy + idle)
        time.sleep(STALL_S)
        for _ in range(2):
            say(
                f"{args.shards} producers, {len(busy) + len(idle):,} topics met among them:"
                f" {window(many, busy, args.window):.0f}% of a core"
            )
        # Looked at once a window, the first look right after the meeting
        # (everything used), the second after a window of the busy ones.
        renewing = RenewingProducer(relays_producer, TopicsMet(args.window - 1, at_least=500))
        meet(Shards(producers=[renewing]), busy + idle)
        time.sleep(STALL_S)
        renewing.topics_met.look()
        say(
            f"a RenewingProducer, {len(busy) + len(idle):,} topics met, before its look:"
            f" {window(Shards(producers=[renewing]), busy, args.window):.0f}% of a core"
        )
        renewed = renewing.renew_if_quiet("bench", logging.getLogger("bench"))
        say(
            f"the same after its look (renewed: {renewed}):"
            f" {window(Shards(producers=[renewing]), busy, args.window):.0f}% of a core"
        )
        say(f"machine after: {machine_load()}")
    finally:
        delete_topics(busy + idle)


if __name__ == "__main__":
    main()
