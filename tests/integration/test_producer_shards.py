"""cronwheel.producer_shards: records sent through several producers, a topic
always through the same one, so each partition keeps the order it was given;
delivery reports come from every shard through one poll or flush. Against the
real broker with the relay's principal, which writes run topics through it."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.producer_shards import ShardedProducer
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

PER_TOPIC = 40


def _names(producer: ShardedProducer, stem: str, at_least: int) -> list[str]:
    """At least `at_least` topic names, and enough that every shard carries one."""
    names: list[str] = []
    while len(names) < at_least or len({id(producer.of(n)) for n in names}) < len(producer.shards):
        names.append(f"{stem}{len(names)}")
    return names


def _learns_partitions(producer: ShardedProducer, name: str, count: int) -> None:
    """The shard carrying `name` asked again until it knows `count` partitions:
    a topic just grown reaches the broker's metadata after CreatePartitions
    returns, and an ask answered at once with the old count must not spend
    the wait (50 quick asks did, once, in a clean-clone run)."""
    wait_for(
        lambda: len(producer.list_topics(name, timeout=2).topics[name].partitions) == count,
        timeout=60,
        interval=0.1,
        what=f"the producer to know {name} at {count} partitions",
    )


def test_sharded__topics_spread_over_shards__each_partition_in_order_all_reported(
    kafka_bootstrap, topic_prefix
):
    producer = ShardedProducer(lambda: kafka.producer(kafka_bootstrap, principal="relay"), 3)
    names = _names(producer, f"{topic_prefix}.runs.shard", 8)
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    assert all(producer.of(name) is producer.of(name) for name in names)
    used = {id(producer.of(name)) for name in names}
    assert len(used) == 3

    reports: list[tuple[str, int, bytes]] = []

    def on_delivery(err, msg):
        assert err is None, err
        reports.append((msg.topic(), msg.offset(), msg.value()))

    for i in range(PER_TOPIC):  # interleaved: every topic's i-th record, then the next
        for name in names:
            producer.produce(name, key=b"k", value=b"%d" % i, on_delivery=on_delivery)
    # Every shard's, counted (librdkafka's count includes protocol requests
    # in flight, such as a metadata refresh: one more was seen under load).
    assert len(producer) >= PER_TOPIC * len(names)
    held = [len(shard) for shard in producer.shards]
    assert sum(1 for n in held if n) == len(used)
    assert producer.flush(30) == 0
    assert len(reports) == PER_TOPIC * len(names)

    # Each partition holds its topic's records in the order produced.
    for name in names:
        mine = [(offset, value) for topic, offset, value in reports if topic == name]
        assert sorted(mine) == [(i, b"%d" % i) for i in range(PER_TOPIC)]
    reader = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        reader.assign([TopicPartition(names[0], 0, OFFSET_BEGINNING)])
        read: list[bytes] = []
        for _ in range(100):  # up to 100 polls of 0.2 s: the records are there already
            read += [m.value() for m in reader.consume(PER_TOPIC, timeout=0.2) if not m.error()]
            if len(read) >= PER_TOPIC:
                break
        assert read == [b"%d" % i for i in range(PER_TOPIC)]
    finally:
        reader.close()


def test_sharded__poll_serves_every_shards_reports(kafka_bootstrap, topic_prefix):
    producer = ShardedProducer(lambda: kafka.producer(kafka_bootstrap, principal="relay"), 3)
    names = _names(producer, f"{topic_prefix}.runs.poll", 6)
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    reported: list[str] = []
    for name in names:
        producer.produce(name, value=b"v", on_delivery=lambda _e, m: reported.append(m.topic()))
    assert all(len(shard) for shard in producer.shards)  # every shard holds one
    served = 0
    for _ in range(300):  # polled with a timeout, not slept: at most 300 x 0.1 s
        served += producer.poll(0.1)
        if served == len(names):
            break
    assert served == len(names) and sorted(reported) == sorted(names)
    assert len(producer) == 0


def test_sharded__a_short_poll_waits_for_its_timeout__not_a_spin(kafka_bootstrap):
    """The relay polled 2 ms a turn while rows were in flight. Shared out
    over four shards that was 0 ms each (librdkafka waits in whole
    milliseconds), so the poll returned at once and the relay's loop spun.
    With nothing to report, 50 such polls now wait at least half their
    100 ms (a lower bound: a loaded machine only makes them longer)."""
    producer = ShardedProducer(lambda: kafka.producer(kafka_bootstrap, principal="relay"), 4)
    began = time.monotonic()
    for _ in range(50):
        assert producer.poll(0.002) == 0
    assert time.monotonic() - began >= 50 * 0.002 / 2


def test_sharded__every_record_reported_per_shard__with_a_callback_or_without(
    kafka_bootstrap, topic_prefix
):
    """What a delivery watch reads (DeliveryWatch.look_each): a record given
    no callback (the relay's wakes) is counted too, for its own shard."""
    producer = ShardedProducer(lambda: kafka.producer(kafka_bootstrap, principal="relay"), 3)
    names = _names(producer, f"{topic_prefix}.runs.count", 3)
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    called = []
    for i, name in enumerate(names):
        if i % 2:
            producer.produce(name, value=b"v", on_delivery=lambda _e, m: called.append(m.topic()))
        else:
            producer.produce(name, value=b"v")
    assert producer.flush(30) == 0
    watched = producer.watched()
    assert len(watched) == 3 and all(held == 0 for held, _reports in watched.values())
    per_shard = {id(shard): 0 for shard in producer.shards}
    for name in names:
        per_shard[id(producer.of(name))] += 1
    assert sorted(r for _held, r in watched.values()) == sorted(per_shard.values())
    assert sorted(called) == sorted(n for i, n in enumerate(names) if i % 2)


def test_one_shard__the_producer_itself():
    made = []

    def make():
        made.append(object())
        return made[-1]

    producer = ShardedProducer(make, 1)
    assert producer.shards == made and producer.of("any.topic") is made[0]


def test_sharded__a_topic_grown__its_own_shard_learns_it_and_takes_the_new_partition(
    kafka_bootstrap, topic_prefix
):
    """A run topic grows to a partition per class (kafka.Placement asks the
    producer for its count): the shard that carries it must be the one that
    learns it, or it refuses the new partition (UNKNOWN_PARTITION)."""
    producer = ShardedProducer(lambda: kafka.producer(kafka_bootstrap, principal="relay"), 3)
    names = _names(producer, f"{topic_prefix}.runs.grow", 3)
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    for name in names:  # each shard meets its topic at one partition
        assert len(producer.list_topics(name, timeout=10).topics[name].partitions) == 1
        producer.produce(name, value=b"before", partition=0)
    assert producer.flush(30) == 0
    admin = kafka.admin(kafka_bootstrap, principal="relay")  # the relay grows run topics
    for name in names:
        kafka.grow_topic(name, 4, client=admin)
    for name in names:
        _learns_partitions(producer, name, 4)
        producer.produce(name, value=b"after", partition=3)
    assert producer.flush(30) == 0


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _with_hot_shard(kafka_bootstrap: str, clock: _Clock) -> ShardedProducer:
    """Two shards and a hot one for the busiest topic (20 records a second)."""
    return ShardedProducer(
        lambda: kafka.producer(kafka_bootstrap, principal="relay"),
        2,
        hot_topics=1,
        hot_rate=20.0,
        clock=clock,
    )


def _hot_moves() -> float:
    return REGISTRY.get_sample_value("cronwheel_producer_hot_moves_total") or 0.0


def _busy_and_quiet(
    kafka_bootstrap: str, clock: _Clock, stem: str
) -> tuple[ShardedProducer, str, str]:
    """A producer with a hot shard, and two one-partition topics made."""
    busy, quiet = f"{stem}busy", f"{stem}quiet"
    kafka.ensure_topics(
        [busy, quiet], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher"
    )
    return _with_hot_shard(kafka_bootstrap, clock), busy, quiet


def test_hot_shard__a_busy_topic_moves_only_with_nothing_outstanding__order_kept__and_back(
    kafka_bootstrap, topic_prefix
):
    """The busiest topic goes through the hot shard once none of its records
    awaits a report (reports come only from poll and flush, so records not
    yet flushed hold it where it is); every partition holds its records in
    the order given, across both moves; quiet three looks, it goes back."""
    clock = _Clock()
    producer, busy, quiet = _busy_and_quiet(kafka_bootstrap, clock, f"{topic_prefix}.runs.")
    hot_shard = producer.shards[-1]
    home = producer.of(busy)
    moves_before = _hot_moves()
    assert home is not hot_shard and len(producer.shards) == 3
    sent: dict[str, list[bytes]] = {busy: [], quiet: []}

    def give(topic: str, n: int) -> None:
        for _ in range(n):
            value = b"%d" % len(sent[topic])
            producer.produce(topic, value=value, partition=0)
            sent[topic].append(value)
            clock.now += 0.01

    give(busy, 100)  # a second at 100 a second, not flushed
    clock.now += 0.05
    give(quiet, 1)  # the look: busy is hot now
    assert producer.hot is not None and producer.hot.hot == {busy}
    give(busy, 10)
    assert producer.of(busy) is home  # 110 records outstanding: it stays
    assert producer.moves_total == 0
    assert producer.flush(30) == 0
    give(busy, 10)
    assert producer.of(busy) is hot_shard and producer.moves_total == 1
    assert len(hot_shard) == 10 and producer.of(quiet) is not hot_shard
    assert producer.flush(30) == 0

    for _ in range(4):  # quiet looks: 1 record a second
        clock.now += 1.0
        give(busy, 1)
    assert producer.hot.hot == set()
    assert producer.of(busy) is hot_shard  # its last record is outstanding there
    assert producer.flush(30) == 0
    give(busy, 1)
    assert producer.of(busy) is home and producer.moves_total == 2
    assert _hot_moves() - moves_before == 2  # exported as a metric too
    assert producer.flush(30) == 0

    for topic in (busy, quiet):
        assert _read_back(kafka_bootstrap, topic_prefix, topic, len(sent[topic])) == sent[topic]


def _read_back(kafka_bootstrap: str, topic_prefix: str, topic: str, n: int) -> list[bytes]:
    """The values in partition 0 of `topic`, from the start, once `n` are
    read (or up to 100 polls of 0.2 s: the records are there already)."""
    reader = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        reader.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        read: list[bytes] = []
        for _ in range(100):
            read += [m.value() for m in reader.consume(500, timeout=0.2) if not m.error()]
            if len(read) >= n:
                break
        return read
    finally:
        reader.close()


def test_hot_shard__a_topic_grown_while_elsewhere__the_shard_it_moves_to_learns_it_first(
    kafka_bootstrap, topic_prefix
):
    """The hot shard met the topic at one partition; it grows (a partition per
    class) while its own shard carries it; moved hot again, the hot shard
    takes the new partition rather than refusing it."""
    clock = _Clock()
    producer = _with_hot_shard(kafka_bootstrap, clock)
    name = f"{topic_prefix}.runs.growhot"
    kafka.ensure_topics([name], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer.shards[-1].produce(name, value=b"met", partition=0)  # the hot shard meets it at 1
    assert producer.flush(30) == 0
    kafka.grow_topic(name, 4, client=kafka.admin(kafka_bootstrap, principal="relay"))
    _learns_partitions(producer, name, 4)
    for _ in range(100):
        producer.produce(name, value=b"v", partition=3)
        clock.now += 0.01
    assert producer.flush(30) == 0
    clock.now += 0.05
    producer.produce(name, value=b"v", partition=3)  # the look: hot; nothing outstanding: moved
    assert producer.of(name) is producer.shards[-1] and producer.moves_total == 1
    assert producer.flush(30) == 0


def test_hot_shard__a_batch__counted_once_per_topic__moves_between_batches__order_kept(
    kafka_bootstrap, topic_prefix
):
    """produce_all (the relay's herd): every record reported once, through
    its caller's callback, counted for the shard that carried it; a topic
    with a batch's records outstanding stays where it is, and moves at a
    later batch once they are reported; each partition keeps the order
    given across the move."""
    clock = _Clock()
    producer, busy, quiet = _busy_and_quiet(kafka_bootstrap, clock, f"{topic_prefix}.runs.batch")
    hot_shard = producer.shards[-1]
    home = producer.of(busy)
    sent: dict[str, list[bytes]] = {busy: [], quiet: []}
    reported: list[tuple[str, bytes]] = []

    def on_delivery(err, msg):
        assert err is None, err
        reported.append((msg.topic(), msg.value()))

    def batch(busy_n: int, quiet_n: int) -> None:
        records = []
        for topic, n in ((busy, busy_n), (quiet, quiet_n)):
            for _ in range(n):
                value = b"%d" % len(sent[topic])
                records.append(
                    {"topic": topic, "value": value, "partition": 0, "on_delivery": on_delivery}
                )
                sent[topic].append(value)
        producer.produce_all(records)

    batch(30, 1)
    clock.now += 1.05  # 30 in a second: busy is hot at the next look
    batch(10, 0)
    assert producer.hot is not None and producer.hot.hot == {busy}
    assert producer.of(busy) is home and producer.moves_total == 0  # 40 outstanding
    assert producer.flush(30) == 0
    batch(10, 1)
    assert producer.of(busy) is hot_shard and producer.moves_total == 1
    assert len(hot_shard) == 10
    assert producer.flush(30) == 0

    assert sorted(reported) == sorted((t, v) for t, values in sent.items() for v in values)
    assert sum(producer.reports) == len(reported) == 52
    assert producer.reports[-1] == 10  # the hot shard's: the last batch's busy records
    assert producer._outstanding == {}
    for topic in (busy, quiet):
        assert _read_back(kafka_bootstrap, topic_prefix, topic, len(sent[topic])) == sent[topic]


def test_batch__a_record_refused__the_rest_not_given__none_left_outstanding(
    kafka_bootstrap, topic_prefix
):
    """A record the client refuses outright (a partition the topic does not
    have) raises; the records before it are delivered, those after it are
    not given, and none is left counted outstanding (which would hold its
    topic on its shard for good)."""
    producer = _with_hot_shard(kafka_bootstrap, _Clock())
    name = f"{topic_prefix}.runs.batchrefused"
    kafka.ensure_topics([name], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    assert len(producer.list_topics(name, timeout=10).topics[name].partitions) == 1
    records = [{"topic": name, "value": b"%d" % i, "partition": 0} for i in range(5)]
    records[2]["partition"] = 7
    with pytest.raises(KafkaException):
        producer.produce_all(records)
    assert producer.flush(30) == 0
    assert producer._outstanding == {} and sum(producer.reports) == 2
    assert _read_back(kafka_bootstrap, topic_prefix, name, 2) == [b"0", b"1"]
