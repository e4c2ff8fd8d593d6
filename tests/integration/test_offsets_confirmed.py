"""Offsets a consumer's paced commit stored are known as confirmed
(cronwheel.consuming.Offsets.on_commit), from the broker's own answer, so a
partition handed over or dozing is not committed again at the same offset.
Against the real broker, with the services' principals; which partitions a
give_up names is tests/unit/test_offsets.py's."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import kafka
from cronwheel.consuming import Offsets

pytestmark = pytest.mark.integration


def test_paced_commit__the_broker_stores_it__confirmed_then_forgotten_on_give_up(
    kafka_bootstrap, topic_prefix
):
    topic = f"{topic_prefix}.runs.confirmed"
    kafka.ensure_topics([topic], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="relay")  # run topics are the relay's
    for i in range(3):
        producer.produce(topic, key=b"k", value=str(i).encode())
    assert producer.flush(30) == 0

    offsets = Offsets("test", commit_every_s=0)
    group = f"{topic_prefix}.dispatcher"
    consumer = kafka.consumer(
        group, kafka_bootstrap, principal="dispatcher", on_commit=offsets.on_commit
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            got += [m for m in consumer.consume(3, timeout=0.5) if m.error() is None]
        assert [m.offset() for m in got] == [0, 1, 2]
        offsets.finished(got[-1])
        offsets.commit(consumer, asynchronous=True)
        assert offsets.confirmed == {}  # not before the broker answered
        deadline = time.monotonic() + 30
        while not offsets.confirmed and time.monotonic() < deadline:
            consumer.consume(1, timeout=0.2)  # serves the commit's callback
        assert offsets.confirmed == {(topic, 0): 3}
        [stored] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert stored.offset == 3

        assert offsets.give_up(consumer, [TopicPartition(topic, 0)]) == {(topic, 0)}
        assert offsets.confirmed == {}
        [stored] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert stored.offset == 3

        # Finished past it, the give_up commits synchronously; that commit's
        # answer does not come back later as a confirmation of a partition
        # already forgotten.
        producer.produce(topic, key=b"k", value=b"3")
        assert producer.flush(30) == 0
        more = []
        deadline = time.monotonic() + 30
        while not more and time.monotonic() < deadline:
            more = [m for m in consumer.consume(1, timeout=0.5) if m.error() is None]
        assert [m.offset() for m in more] == [3]
        offsets.finished(more[0])
        assert offsets.give_up(consumer, [TopicPartition(topic, 0)]) == {(topic, 0)}
        [stored] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert stored.offset == 4
        for _ in range(5):
            consumer.consume(1, timeout=0.2)
        assert offsets.confirmed == {}
    finally:
        consumer.close()
