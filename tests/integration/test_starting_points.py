"""Where the platform's hand-assigned consumers start a partition
(cronwheel.consuming.starting_points): always at an offset they give,
because librdkafka's own fetch of committed offsets for an assignment is not
retried after a request-level error and leaves the partition unread. Against
the real broker, with the services' principals."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, TopicPartition

from cronwheel import kafka
from cronwheel.consuming import FIRST_OFFSET, starting_points
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def _records_then_retention(
    bootstrap: str, topic: str, *, partition: int, records: int, deleted_below: int
):
    """`records` records k0, k1, ... in the partition, then those below
    `deleted_below` deleted, as retention would (the admin's delete-records:
    the log starts there now). The producer, to write more."""
    producer = kafka.producer(bootstrap, principal="relay")
    for i in range(records):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v", partition=partition)
    assert producer.flush(30) == 0
    admin = kafka.admin(bootstrap, principal="admin")
    for future in admin.delete_records([TopicPartition(topic, partition, deleted_below)]).values():
        assert future.result(timeout=30).low_watermark == deleted_below
    return producer


def _poll_into(consumer, read: list) -> None:
    """One poll; what came (a record's key and offset, or an error) into `read`."""
    m = consumer.poll(0.1)
    if m is not None:
        read.append(m.error() or (m.key(), m.offset()))


@pytest.fixture
def topic(kafka_bootstrap, topic_prefix) -> str:
    name = f"{topic_prefix}.runs.starting"
    kafka.ensure_topics([name], partitions=3, bootstrap=kafka_bootstrap, principal="dispatcher")
    return name


def test_starting_points__committed_else_offset_0__a_given_offset_kept(
    kafka_bootstrap, topic_prefix, topic
):
    group = f"{topic_prefix}.dispatcher"
    committer = kafka.consumer(group, kafka_bootstrap, principal="dispatcher")
    try:
        committer.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
    finally:
        committer.close()
    consumer = kafka.consumer(group, kafka_bootstrap, principal="dispatcher")
    try:
        asked = [
            TopicPartition(topic, 0),  # OFFSET_INVALID: the committed one
            TopicPartition(topic, 1),  # none committed: offset 0
            TopicPartition(topic, 2, 3),  # its own
        ]
        assert asked[0].offset == OFFSET_INVALID
        got = starting_points(consumer, asked)
        assert got is not None
        assert [(tp.topic, tp.partition, tp.offset) for tp in got] == [
            (topic, 0, 7),
            (topic, 1, FIRST_OFFSET),
            (topic, 2, 3),
        ]
    finally:
        consumer.close()


def test_starting_points__none_committed__the_log_start_moved__read_from_where_it_is_now(
    kafka_bootstrap, topic_prefix, topic
):
    """Nothing committed starts at offset 0, not OFFSET_BEGINNING, whose
    lookup waits behind the fetch outstanding on the leader's connection.
    Where retention moved the log's start past 0 (here records deleted, as
    the admin would), the fetch at 0 is out of range and the consumer resets
    to the earliest record: none skipped, no error, and its position unknown
    until the first record (the fetch watch judges nothing before it)."""
    _records_then_retention(kafka_bootstrap, topic, partition=2, records=5, deleted_below=3)
    consumer = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        got = starting_points(consumer, [TopicPartition(topic, 2)])
        assert got is not None and [tp.offset for tp in got] == [FIRST_OFFSET]
        consumer.assign(got)
        read: list = []

        def two() -> bool:
            _poll_into(consumer, read)
            return len(read) >= 2

        wait_for(two, timeout=30, what="the records left")
        assert read == [(b"k3", 3), (b"k4", 4)]
    finally:
        consumer.close()


def test_starting_points__none_committed__every_record_gone__position_unknown_until_one_comes(
    kafka_bootstrap, topic_prefix, topic
):
    """Assigned at 0 where retention left nothing (the log starts and ends at
    2): reset and fetched, its position stays unknown, as the fetch watch
    and the dozing read it (a 0 there would be a partition behind records
    it never reads); the next record is read at 2."""
    producer = _records_then_retention(
        kafka_bootstrap, topic, partition=0, records=2, deleted_below=2
    )
    stats: list[dict] = []
    consumer = kafka.consumer(
        f"{topic_prefix}.dispatcher",
        kafka_bootstrap,
        principal="dispatcher",
        **{"statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(json.loads(s))},
    )
    tp = TopicPartition(topic, 0)
    try:
        got = starting_points(consumer, [tp])
        assert got is not None and [t.offset for t in got] == [FIRST_OFFSET]
        consumer.assign(got)
        read: list = []

        def reset() -> bool:
            _poll_into(consumer, read)
            # librdkafka's own account: fetching, from 2 (the reset done).
            if not stats:
                return False
            part = stats[-1].get("topics", {}).get(topic, {}).get("partitions", {}).get("0", {})
            return part.get("fetch_state") == "active" and part.get("next_offset") == 2

        wait_for(reset, timeout=30, what="the fetch reset to the log's start")
        assert read == [] and consumer.position([tp])[0].offset == OFFSET_INVALID
        producer.produce(topic, key=b"k2", value=b"v", partition=0)
        assert producer.flush(30) == 0

        def one() -> bool:
            _poll_into(consumer, read)
            return bool(read)

        wait_for(one, timeout=30, what="the next record")
        assert read == [(b"k2", 2)] and consumer.position([tp])[0].offset == 3
    finally:
        consumer.close()


def test_starting_points__committed_offsets_refused__none__nothing_raised(
    kafka_bootstrap, topic_prefix, topic
):
    """A group the principal may not read: the broker refuses the offset
    fetch as a whole, as NOT_COORDINATOR does while a group's coordinator
    moves. The caller gets None (and assigns nothing yet), not an
    assignment librdkafka would leave unread."""
    if "sasl.username" not in kafka.security("dispatcher", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    consumer = kafka.consumer(
        f"{topic_prefix}.not-the-dispatchers", kafka_bootstrap, principal="dispatcher"
    )
    try:
        assert starting_points(consumer, [TopicPartition(topic, 0)], timeout_s=10) is None
        # A given offset needs no fetch: assigned as it is.
        got = starting_points(consumer, [TopicPartition(topic, 1, 4)], timeout_s=10)
        assert got is not None and [tp.offset for tp in got] == [4]
    finally:
        consumer.close()


def test_librdkafka__assigned_without_offset__its_own_fetch_refused__partition_never_read(
    kafka_bootstrap, topic_prefix, topic
):
    """Why starting_points exists: assigned at OFFSET_INVALID, librdkafka
    fetches the committed offset itself; refused as a whole, it reports the
    error once and never starts the partition, though it stays assigned and
    records wait on it. If a librdkafka upgrade fixes this, this test fails
    and the workaround's comment should say so."""
    if "sasl.username" not in kafka.security("dispatcher", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    producer = kafka.producer(kafka_bootstrap, principal="relay")
    producer.produce(topic, key=b"k", value=b"v", partition=0)
    assert producer.flush(15) == 0
    consumer = kafka.consumer(
        f"{topic_prefix}.not-the-dispatchers", kafka_bootstrap, principal="dispatcher"
    )
    try:
        consumer.incremental_assign([TopicPartition(topic, 0)])
        errors, records = [], []
        for _ in range(5):  # 5 s of consuming; the record is on the broker already
            for m in consumer.consume(10, timeout=1.0):
                (errors if m.error() else records).append(m)
        assert records == []
        assert [m.error().code() for m in errors] == [KafkaError.GROUP_AUTHORIZATION_FAILED]
        assert [(tp.topic, tp.partition) for tp in consumer.assignment()] == [(topic, 0)]
    finally:
        consumer.close()
