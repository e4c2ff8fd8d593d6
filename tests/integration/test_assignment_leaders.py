"""A topic made after its consumer learned the cluster is assigned with its
leader known (cronwheel.assignment.learn_leaders): otherwise librdkafka
assigns it leaderless, waits for its next metadata refresh and retries the
first offset lookup on a 500 ms timer, and a new tenant's first run was read
1.8 s after its topic was assigned. Against the real broker, as the
dispatcher's principal."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from cronwheel import kafka
from cronwheel.assignment import learn_leaders
from cronwheel.kafka import Topics
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_learn_leaders__a_topic_made_after_the_consumer_met_the_cluster__assigned_with_its_leader(
    kafka_bootstrap, topic_prefix
):
    topics = Topics(topic_prefix)
    stats: list[dict] = []
    consumer = kafka.consumer(
        f"{topic_prefix}.dispatcher",
        kafka_bootstrap,
        principal="dispatcher",
        **{"statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(json.loads(s))},
    )
    try:
        consumer.list_topics(timeout=10)  # connected, its metadata taken before the topic exists
        name = topics.runs("acme")
        kafka.ensure_topics([name], partitions=1, principal="dispatcher")

        learn_leaders(consumer, {name}, end_fetch=lambda: True)  # none outstanding here
        consumer.incremental_assign([TopicPartition(name, 0, OFFSET_BEGINNING)])

        # The first statistics that know the topic: librdkafka makes it
        # local at the assignment, from its metadata cache. Its own refresh
        # comes at the next second's scan, after this first report.
        def first_report() -> dict | None:
            consumer.poll(0.02)
            return next((s["topics"][name] for s in stats if name in s.get("topics", {})), None)

        report = wait_for(first_report, timeout=10, what="statistics naming the topic")
        assert report["partitions"]["0"]["leader"] >= 0, report["partitions"]["0"]
    finally:
        consumer.close()


def test_learn_leaders__the_fetch_ended_before_each_ask__none_past_a_few_or_when_it_cannot_be(
    kafka_bootstrap, topic_prefix
):
    """Each ask blocks the loop behind the consumer's outstanding fetch: the
    fetch is ended before each one, and none is asked when it cannot be, nor
    past LEARN_LEADERS_UP_TO (a start with thousands of tenants: their
    leaders come with the refresh)."""
    from cronwheel.assignment import LEARN_LEADERS_UP_TO

    consumer = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        asked: list[str] = []
        real = consumer.list_topics

        class Watching:
            def list_topics(self, topic=None, timeout=-1):
                asked.append(topic)
                return real(topic, timeout=timeout)

        def ended() -> bool:
            asked.append("ended")
            return True

        many = {f"{topic_prefix}.runs.t{i}" for i in range(LEARN_LEADERS_UP_TO + 1)}
        learn_leaders(Watching(), many, ended)
        assert asked == []
        few = sorted(many)[:2]
        learn_leaders(Watching(), set(few), lambda: False)
        assert asked == []
        learn_leaders(Watching(), set(few), ended)
        assert asked == ["ended", few[0], "ended", few[1]]
    finally:
        consumer.close()
