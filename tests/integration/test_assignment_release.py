"""Leases released at a renewal while new topics were waiting to be assigned
(cronwheel.assignment.LeasedAssignment.renew): the release brings the
assignment up to date inside the lease transaction, new topics included,
and what it assigned is returned by the next apply, so the service hears of
every partition it was assigned (the dispatcher tracks each for dozing and
reads its classes again there). Before, those were assigned and never
returned. Against the real lease table and broker, as the dispatcher."""

from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import TopicPartition

from cronwheel import kafka
from cronwheel.assignment import LeasedAssignment
from cronwheel.core.ids import partition_of
from cronwheel.kafka import Placement, Topics
from cronwheel.store.leases import PARTITIONS, Leases

pytestmark = pytest.mark.integration


def test_leases_released_while_new_topics_waited__every_partition_assigned_is_returned(
    database_url, kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    group = f"{topic_prefix}.dispatcher"
    tenants = [f"t{i}" for i in range(40)]
    names = [topics.runs(t) for t in tenants]
    kafka.ensure_topics(names, partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    # The release hands over the upper half of the lease partitions (Leases.tick).
    kept = {topics.runs(t) for t in tenants if partition_of(t) < PARTITIONS // 2}
    assert kept and len(kept) < len(names), "the tenants fall on one side of the split"
    consumer = kafka.consumer(group, kafka_bootstrap, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="dispatcher")
    mine = LeasedAssignment(
        Leases(group, ttl_ms=60_000), f"{topic_prefix}.runs.", Placement(producer)
    )
    given_up: list[TopicPartition] = []
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            mine.renew(conn, consumer, given_up.extend)  # every lease, no topic yet
            assert len(mine.owned) == PARTITIONS and mine.apply(consumer, given_up.extend) == []
            Leases(group, ttl_ms=60_000).tick(conn)  # a second instance: half is its share
            mine.topics(names)  # the watch's new topics, not yet applied
            mine.renew(conn, consumer, given_up.extend)  # releases half, assigns inside
        assert len(mine.owned) == PARTITIONS // 2
        returned = mine.apply(consumer, given_up.extend)
        assert {tp.topic for tp in returned} == kept
        assert {tp.topic for tp in consumer.assignment()} == kept
        assert mine.apply(consumer, given_up.extend) == []  # told once
        assert given_up == []  # nothing was assigned before the release
    finally:
        consumer.close()
