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

The busiest topics get a producer of their own (`hot_topics`, `HotTopics`):
librdkafka's broker thread walks every partition its producer has met each
time it wakes, about once per record at a linger of 1 ms
(confluentinc/librdkafka#2270), so ten busy tenants beside 3,000 idle ones
cost their producer a walk over the idle tenants' partitions per record: the
relay used 43% of a core against 27% beside 10 (`bench_firing_steady.py
--idle-tenants 3000`, docs/architecture.md). On the hot shard a busy topic's
records wake a thread that has met only the few busy topics. What holds
there:

- A topic moves between its shard and the hot one only while none of its
  records is outstanding (given, and no delivery report yet): everything
  sent before the move has been acknowledged or failed, so a partition's
  records still reach the broker in the order given, each producer's
  sequence numbers its own. A topic with a record always outstanding stays
  where it is.
- The shard a topic moves to asks for its metadata first (`LEARN_S` at
  most, else the move waits): it may know the topic from before it grew a
  partition per class, and a producer refuses a partition it does not know.
- Which topics are hot is decided once a second (`HotTopics`): the busiest
  topics at `hot_rate` records a second or more, at most `hot_topics` of
  them; a hot topic goes back after three looks in a row below half that
  rate.
- The bookkeeping (records outstanding per topic, the moves) is under a
  lock: records are given from more than one thread (the relay's loop and
  its releaser), and reports come on whichever thread polls.

Many records at once (`produce_all`, the relay's herd of runs due at one
instant): the bookkeeping is done once per topic, before the first record
is given, and the records are then given with no lock held. What holds
there: a batch's topics are counted outstanding for all of its records
first, so none of them can move while the batch is being given (a move
needs none outstanding), and the lock is free for the reports that a full
local queue's wait (`produce`, polling) serves meanwhile. A record given
this way costs little beyond the client's own call (docs/architecture.md,
"A herd given at once", has the figures).
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import zlib
from collections.abc import Callable

from confluent_kafka import Producer

from cronwheel import metrics

FOREVER_SHARE_S = 0.05  # poll(-1): each shard's turn at waiting
HOT_RATE = 20.0  # records a second from which a topic may get the hot shard
LEARN_S = 1.0  # the longest a move waits for the shard to learn the topic
_KEYS = itertools.count()  # names each shard ever made, for a delivery watch


def produce(producer: Producer, **record) -> None:
    """`producer.produce(**record)`; while its local queue is full
    (BufferError), let deliveries drain and try again: never drop a record."""
    while True:
        try:
            producer.produce(**record)
            return
        except BufferError:
            producer.poll(0.05)


def produce_all(producer, records: list[dict]) -> None:
    """Each of `records` (produce()'s keyword arguments, `on_delivery`
    among them) given to `producer` in order as `produce` gives one, through
    the producer's own `produce_all` where it has one (ShardedProducer,
    RenewingProducer). The dicts are the callee's from then on: a wrapper
    may replace their callback in place."""
    many = getattr(producer, "produce_all", None)
    if many is not None:
        many(records)
        return
    for record in records:
        produce(producer, **record)


class ShardedProducer:
    """`shards` producers made by `make`, behind one producer's interface
    (produce, poll, flush, purge, len, list_topics; anything else asks the
    first)."""

    def __init__(
        self,
        make: Callable[[], Producer],
        shards: int,
        *,
        hot_topics: int = 0,
        hot_rate: float = HOT_RATE,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`hot_topics`: at most this many of the busiest topics (at
        `hot_rate` records a second or more) go through one more producer of
        their own; 0: none does."""
        self.shards = [make() for _ in range(max(1, shards))]
        self._hashed = len(self.shards)  # the shards a topic's name picks
        self.hot: HotTopics | None = None
        if hot_topics > 0:
            self.hot = HotTopics(hot_topics, hot_rate, clock=clock)
            self.shards.append(make())  # the hot shard, last
        self.reports = [0] * len(self.shards)  # delivery reports, per shard
        self._keys = [next(_KEYS) for _ in self.shards]
        self._lock = threading.Lock()  # the hot bookkeeping below
        self._outstanding: dict[str, int] = {}  # records given, no report yet
        self._on_hot: set[str] = set()  # topics the hot shard (the last) carries now
        self.moves_total = 0  # topics moved to the hot shard or back

    def _index(self, topic: str) -> int:
        if topic in self._on_hot:
            return len(self.shards) - 1
        return self._hashed_index(topic)

    def _hashed_index(self, topic: str) -> int:
        if self._hashed == 1:
            return 0
        return zlib.crc32(topic.encode()) % self._hashed

    def of(self, topic: str) -> Producer:
        """The shard that carries `topic`."""
        return self.shards[self._index(topic)]

    def produce(self, *args, **kwargs) -> None:
        """As Producer.produce; a delivery callback is given by keyword
        (`on_delivery` or `callback`), and every record gets a report,
        counted for its shard."""
        topic = kwargs["topic"] if "topic" in kwargs else args[0]
        given = kwargs.pop("on_delivery", None), kwargs.pop("callback", None)
        i = self._given({topic: 1})[topic]
        kwargs["on_delivery"] = self._counted(i, given[0] or given[1], self._tracked(topic))
        try:
            self.shards[i].produce(*args, **kwargs)
        except BaseException:  # not taken (BufferError...): no report will come
            self._not_given([topic])
            raise

    def produce_all(self, records: list[dict]) -> None:
        """Each record given in order, as `produce` gives one (module
        function: a full local queue waited out), with the per-topic
        bookkeeping once for the whole batch (module docstring). A record
        not given (an error other than a full queue) gets no report: it is
        counted settled, with those after it, and the error raised."""
        if not records:
            return
        shard_of = self._given(collections.Counter(record["topic"] for record in records))
        given = 0
        try:
            for record in records:
                topic = record["topic"]
                i = shard_of[topic]
                record["on_delivery"] = self._counted(
                    i, record.get("on_delivery"), self._tracked(topic)
                )
                shard = self.shards[i]
                try:
                    shard.produce(**record)
                except BufferError:  # a full local queue: waited out
                    produce(shard, **record)
                given += 1
        except BaseException:
            self._not_given([record["topic"] for record in records[given:]])
            raise

    def _given(self, counts: dict[str, int]) -> dict[str, int]:
        """The shard of each topic about to be given `counts[topic]` records.
        With a hot shard, under the lock: each topic counted for HotTopics
        (and moved if it may be), and its records counted outstanding before
        any is given (a report may come on another thread before produce()
        returns), so none of these topics moves until all are reported."""
        if self.hot is None:
            return {topic: self._index(topic) for topic in counts}
        with self._lock:
            for topic, n in counts.items():
                self._place(topic, n)
                self._outstanding[topic] = self._outstanding.get(topic, 0) + n
            return {topic: self._index(topic) for topic in counts}

    def _tracked(self, topic: str) -> str | None:
        """The topic a record's report settles (None without a hot shard)."""
        return topic if self.hot is not None else None

    def _not_given(self, topics: list[str]) -> None:
        """Records counted by `_given` that were not given: no report will
        come for them."""
        if self.hot is not None and topics:
            with self._lock:
                for topic in topics:
                    self._settled(topic)

    def _report(self, i: int, topic: str | None, then: Callable | None, err, msg) -> None:
        """A record's delivery report: the callback librdkafka is given
        (`_counted`), counted for shard `i`, then the caller's."""
        self.reports[i] += 1
        if topic is not None:
            with self._lock:
                self._settled(topic)
        if then is not None:
            then(err, msg)

    def _place(self, topic: str, n: int = 1) -> None:
        """Under _lock: count the `n` records, and move the topic to the hot shard
        or back if `HotTopics` wants it there and none of its records is
        outstanding."""
        assert self.hot is not None
        self.hot.count(topic, n)
        want_hot = topic in self.hot.hot
        if want_hot == (topic in self._on_hot) or self._outstanding.get(topic):
            return
        to = len(self.shards) - 1 if want_hot else self._hashed_index(topic)
        if not self._learn(to, topic):
            # Not known there (no broker?): it stays where it was, and
            # HotTopics decides again at its next look, not at each record.
            self.hot.stay(topic, hot=not want_hot)
            return
        if want_hot:
            self._on_hot.add(topic)
        else:
            self._on_hot.discard(topic)
        self.moves_total += 1
        metrics.PRODUCER_HOT_MOVES.inc()

    def _learn(self, i: int, topic: str) -> bool:
        """The shard `i` asks for the topic's metadata before its first
        record there: the partitions it knows may be older than the topic
        (grown for its classes while another shard carried it), and a
        producer refuses a partition it does not know."""
        try:
            meta = self.shards[i].list_topics(topic, timeout=LEARN_S).topics.get(topic)
        except Exception:  # KafkaException (no broker): not moved now
            return False
        return meta is not None and meta.error is None and bool(meta.partitions)

    def _settled(self, topic: str) -> None:
        """Under _lock: one of the topic's records has its report."""
        left = self._outstanding.get(topic, 0) - 1
        if left > 0:
            self._outstanding[topic] = left
        else:
            self._outstanding.pop(topic, None)

    def _counted(self, i: int, then: Callable | None, topic: str | None = None) -> Callable:
        return functools.partial(self._report, i, topic, then)

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


class HotTopics:
    """Which topics go through the hot shard: looked at once every `every_s`,
    from the records given since the last look. The busiest at `rate`
    records a second or more become hot, up to `at_most`; a hot topic goes
    back after `cool_looks` looks in a row below half that rate (not at the
    first quiet second, so a topic near the rate does not move to and fro)."""

    def __init__(
        self,
        at_most: int,
        rate: float,
        *,
        every_s: float = 1.0,
        cool_looks: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.at_most = at_most
        self.rate = rate
        self.every_s = every_s
        self.cool_looks = cool_looks
        self._clock = clock
        self._since = clock()
        self._counts: dict[str, int] = {}
        self._cool: dict[str, int] = {}  # hot topic -> looks in a row below half the rate
        self.hot: set[str] = set()

    def count(self, topic: str, n: int = 1) -> None:
        """`n` records for `topic`; the look is taken when one is due."""
        self._counts[topic] = self._counts.get(topic, 0) + n
        now = self._clock()
        if now - self._since >= self.every_s:
            self._look(now)

    def stay(self, topic: str, *, hot: bool) -> None:
        """The topic could not move: it is (or is not) hot until a later look
        decides again, rather than asked to move at every record."""
        if hot:
            self.hot.add(topic)
        else:
            self.hot.discard(topic)
        self._cool.pop(topic, None)

    def _look(self, now: float) -> None:
        elapsed = now - self._since
        rates = {topic: n / elapsed for topic, n in self._counts.items()}
        self._counts = {}
        self._since = now
        for topic in list(self.hot):
            if rates.get(topic, 0.0) >= self.rate / 2:
                self._cool.pop(topic, None)
                continue
            self._cool[topic] = self._cool.get(topic, 0) + 1
            if self._cool[topic] >= self.cool_looks:
                self.hot.discard(topic)
                del self._cool[topic]
        busy = sorted(
            (t for t, r in rates.items() if r >= self.rate and t not in self.hot),
            key=lambda t: -rates[t],
        )
        self.hot.update(busy[: max(0, self.at_most - len(self.hot))])
