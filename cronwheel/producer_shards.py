"""A producer made of several, each topic always sent through the same one.

Why: librdkafka puts one partition in each ProduceRequest
(confluentinc/librdkafka#1700, open), and the broker answers the requests of
one connection one at a time, in order. A minute's herd of N tenants, one
record to each tenant's topic, is thus N requests in a row through one
producer. K producers are K connections, which the broker serves side by
side: a herd of 3,000 tenants passed a plain forwarder, Kafka alone, with a
p99 of ~1.0 s through four producers per stage against ~2.0 s through one
(`bench/bench_kafka_floor.py --case herd --shards`; docs/dispatcher.md, "A
minute's herd, end to end").

What holds:

- A topic's records all go through one shard (its name's CRC-32 modulo the
  shards), so the order within a partition, and the idempotent producer's
  sequence for it, are what a single producer gives.
- Delivery reports come from `poll` and `flush`, as from one producer: each
  serves every shard's. Every record gets one, counted per shard (`watched`),
  so a delivery watch sees a shard that stopped delivering while the others
  go on (cronwheel.fetch_watch.DeliveryWatch.look_each).
- `len` is what every shard holds; `flush` waits for all of them within one
  deadline; `purge` purges all.
- A topic's metadata is asked through its own shard (`list_topics`): a
  producer learns a topic just made, or the partitions it grew to, only by
  asking, and refuses a partition it does not know.
- One shard is the single producer it was before, behind one more call.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Callable

from confluent_kafka import Producer

FOREVER_SHARE_S = 0.05  # poll(-1): each shard's turn at waiting
_KEYS = itertools.count()  # names each shard ever made, for a delivery watch


class ShardedProducer:
    """`shards` producers made by `make`, behind one producer's interface
    (produce, poll, flush, purge, len, list_topics; anything else asks the
    first)."""

    def __init__(self, make: Callable[[], Producer], shards: int):
        self.shards = [make() for _ in range(max(1, shards))]
        self.reports = [0] * len(self.shards)  # delivery reports, per shard
        self._keys = [next(_KEYS) for _ in self.shards]

    def _index(self, topic: str) -> int:
        if len(self.shards) == 1:
            return 0
        return zlib.crc32(topic.encode()) % len(self.shards)

    def of(self, topic: str) -> Producer:
        """The shard that carries `topic`."""
        return self.shards[self._index(topic)]

    def produce(self, *args, **kwargs) -> None:
        """As Producer.produce; a delivery callback is given by keyword
        (`on_delivery` or `callback`), and every record gets a report,
        counted for its shard."""
        topic = kwargs["topic"] if "topic" in kwargs else args[0]
        i = self._index(topic)
        given = kwargs.pop("on_delivery", None), kwargs.pop("callback", None)
        then = given[0] or given[1]
        kwargs["on_delivery"] = self._counted(i, then)
        self.shards[i].produce(*args, **kwargs)

    def _counted(self, i: int, then: Callable | None) -> Callable:
        def counted(err, msg) -> None:
            self.reports[i] += 1
            if then is not None:
                then(err, msg)

        return counted

    def watched(self) -> dict[int, tuple[int, int]]:
        """Per shard, under a key no other shard is given (one made by a
        renewal is another): (records held, delivery reports so far), for a
        delivery watch."""
        return {
            key: (len(shard), self.reports[i])
            for i, (key, shard) in enumerate(zip(self._keys, self.shards, strict=True))
        }

    def poll(self, timeout: float = -1) -> int:
        """Every shard's delivery reports so far; if there were none, waits
        up to `timeout` for one on the shard holding the most records, then
        serves the others' (negative: until one comes, on each shard in
        turn). One shard waits, not each a share: librdkafka waits in whole
        milliseconds, so four shares of a 2 ms wait (the relay's, per turn
        with rows in flight, when it was written) were 0 ms each, a poll
        that never waited, and the relay's loop spun (83% of a core against
        30% through one producer, `bench_firing_steady.py`). A timeout under
        a millisecond waits for nothing, as one producer's does."""
        if len(self.shards) == 1:
            return self.shards[0].poll(timeout)
        served = sum(shard.poll(0) for shard in self.shards)
        if served or not timeout:
            return served
        if timeout > 0:
            busiest = max(self.shards, key=len)
            served = busiest.poll(timeout)
            return served + sum(shard.poll(0) for shard in self.shards if shard is not busiest)
        while True:
            for shard in self.shards:
                served += shard.poll(FOREVER_SHARE_S)
                if served:
                    return served

    def flush(self, timeout: float = -1) -> int:
        """Every shard flushed within `timeout` in all; what is left undelivered."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        for shard in self.shards:
            shard.flush(-1 if deadline is None else max(0.0, deadline - time.monotonic()))
        return len(self)

    def list_topics(self, topic: str | None = None, timeout: float = -1):
        """The metadata of `topic`, asked through the shard that carries it:
        a caller asks so that the producer learns a topic just made, or the
        partitions it grew to (cronwheel.consumer.make_known, kafka.Placement),
        and another shard learning it would leave that one refusing the new
        partition. Every topic's (the topic watch's scan, the placement's
        first counts): asked through the first shard alone, as one request
        of a cluster's metadata costs what it costs; a shard meeting a topic
        asks the broker for it itself."""
        if topic is None:
            return self.shards[0].list_topics(timeout=timeout)
        return self.of(topic).list_topics(topic, timeout=timeout)

    def purge(self, *args, **kwargs) -> None:
        for shard in self.shards:
            shard.purge(*args, **kwargs)

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)

    def __getattr__(self, name: str):
        if name == "shards":  # not made yet (make() raised): no recursion
            raise AttributeError(name)
        return getattr(self.shards[0], name)
