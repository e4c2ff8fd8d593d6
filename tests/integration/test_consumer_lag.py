"""The consumer lag a service publishes (cronwheel.consuming.report_lag):
records past where each assigned partition was consumed to, by the
watermarks its fetches brought; partitions dozing are left out. A caller
that keeps its assignment and positions (the dispatcher) gives them, so
librdkafka is asked only the watermarks (each partition asked of it is a
lookup by name, a walk over every topic it knows). Against the real
broker, with the services' principals."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, TopicPartition
from prometheus_client import REGISTRY

from cronwheel import kafka
from cronwheel.consuming import report_lag
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_lag__records_past_the_positions__the_callers_when_it_keeps_them__dozing_left_out(
    kafka_bootstrap, topic_prefix
):
    topics = [f"{topic_prefix}.runs.lag{i}" for i in range(3)]
    kafka.ensure_topics(topics, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")  # run topics are the relay's
    for topic, n in zip(topics, (5, 3, 4), strict=True):
        for i in range(n):
            producer.produce(topic, key=b"k", value=str(i).encode())
    assert producer.flush(30) == 0

    consumer = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in topics])
        # Read at least two of the first topic's records (and what else the
        # consumer hands out meanwhile), then nothing more; librdkafka keeps
        # fetching in the background, so every partition's end becomes known.
        produced = dict(zip(keys := [(t, 0) for t in topics], (5, 3, 4), strict=True))
        read = dict.fromkeys(keys, 0)

        def two_read_and_every_end_known() -> bool:
            if read[keys[0]] < 2:
                for m in consumer.consume(1, timeout=0.2):
                    if m.error() is None:
                        read[(m.topic(), m.partition())] += 1
            ends = {
                key: consumer.get_watermark_offsets(TopicPartition(*key), cached=True)[1]
                for key in keys
            }
            return read[keys[0]] >= 2 and ends == produced

        wait_for(two_read_and_every_end_known, 30, what="two records read, every end known")
        # Consumed from the start: the next offset to read is how many were read.
        assert {
            (tp.topic, tp.partition): tp.offset
            for tp in consumer.position([TopicPartition(*key) for key in keys])
        } == {key: read[key] if read[key] else OFFSET_INVALID for key in keys}

        # The caller's positions count, not librdkafka's (the dispatcher's own:
        # where it consumed to, or where it was assigned, its committed offset,
        # for a partition it has read nothing of); the first topic's differs
        # from librdkafka's, which has read two or more of it.
        at = {keys[0]: 1, keys[1]: 2, keys[2]: 0}
        mine = lambda ks: {k: at[k] for k in ks}  # noqa: E731
        behind = {key: produced[key] - at[key] for key in keys}
        assert report_lag(consumer, "test", assigned=keys, position=mine) == 4 + 1 + 4
        assert REGISTRY.get_sample_value("cronwheel_consumer_lag", {"consumer": "test"}) == 9
        # A partition dozing says nothing: left out.
        assert (
            report_lag(consumer, "test", skip={keys[2]}, assigned=keys, position=mine)
            == behind[keys[0]] + behind[keys[1]]
        )
        # librdkafka's own assignment and positions: a partition it has handed
        # out nothing of has no position, and is not counted.
        assert report_lag(consumer, "test") == sum(
            produced[key] - read[key] for key in keys if read[key]
        )
    finally:
        consumer.close()
