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


def _assigned_with_its_leader(consumer, name: str, stats: list[dict]) -> None:
    """Assign the topic's partition 0; the first statistics that know the
    topic (librdkafka makes it local at the assignment, from its metadata
    cache; its own refresh comes at the next second's scan, after this first
    report) show its leader."""
    consumer.incremental_assign([TopicPartition(name, 0, OFFSET_BEGINNING)])

    def first_report() -> dict | None:
        consumer.poll(0.02)
        return next((s["topics"][name] for s in stats if name in s.get("topics", {})), None)

    report = wait_for(first_report, timeout=10, what="statistics naming the topic")
    assert report["partitions"]["0"]["leader"] >= 0, report["partitions"]["0"]


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
        _assigned_with_its_leader(consumer, name, stats)
    finally:
        consumer.close()


def test_learn_leaders__the_fetch_ended_before_each_ask__else_not_waited_for__none_past_a_few(
    kafka_bootstrap, topic_prefix
):
    """Each waited ask blocks the loop behind the consumer's outstanding
    fetch: the fetch is ended before each one; where it cannot be, each is
    sent and not waited for; none past LEARN_LEADERS_UP_TO (a start with
    thousands of tenants: their leaders come with the refresh)."""
    from cronwheel.assignment import LEARN_LEADERS_UP_TO, UNWAITED_S

    consumer = kafka.consumer(f"{topic_prefix}.dispatcher", kafka_bootstrap, principal="dispatcher")
    try:
        asked: list[str] = []
        waits: list[float] = []
        real = consumer.list_topics

        class Watching:
            def list_topics(self, topic=None, timeout=-1):
                asked.append(topic)
                waits.append(timeout)
                return real(topic, timeout=timeout)

        def ended() -> bool:
            asked.append("ended")
            return True

        many = {f"{topic_prefix}.runs.t{i}" for i in range(LEARN_LEADERS_UP_TO + 1)}
        learn_leaders(Watching(), many, ended)
        assert asked == []
        few = sorted(many)[:2]
        # Not ended: each asked and not waited for (ask_unwaited).
        learn_leaders(Watching(), set(few), lambda: False)
        assert asked == few and waits == [UNWAITED_S, UNWAITED_S]
        asked.clear(), waits.clear()
        learn_leaders(Watching(), set(few), ended)
        assert asked == ["ended", few[0], "ended", few[1]]
        assert UNWAITED_S not in waits
    finally:
        consumer.close()


def test_ask_unwaited__the_answer_comes_after_the_call__fills_the_consumers_cache(
    kafka_bootstrap, topic_prefix
):
    """The webhook service's and the executor's consumers cannot end their
    outstanding fetch, so their asks are not waited for: the call returns at
    once (timed out, as meant) and the answer, when it comes, fills the
    consumer's metadata cache. librdkafka's metadata log (debug=metadata)
    shows the answer naming the topic; the first statistics after the
    assignment show its leader from that cache."""
    import logging

    topics = Topics(topic_prefix)
    name = topics.webhook("acme")
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    librdkafka = logging.getLogger(f"librdkafka.{topic_prefix}")
    librdkafka.addHandler(Lines())
    librdkafka.propagate = False
    librdkafka.setLevel(logging.DEBUG)
    stats: list[dict] = []
    consumer = kafka.consumer(
        f"{topic_prefix}.webhook",
        kafka_bootstrap,
        principal="webhook",
        logger=librdkafka,
        debug="metadata",
        log_level=7,  # debug lines pass (kafka.consumer's level is errors only)
        **{"statistics.interval.ms": 100, "stats_cb": lambda s: stats.append(json.loads(s))},
    )
    try:
        consumer.list_topics(timeout=10)  # connected, its metadata taken before the topic exists
        kafka.ensure_topics([name], partitions=1, principal="dispatcher")
        lines.clear()

        learn_leaders(consumer, {name}, end_fetch=None)

        def answered() -> bool:
            consumer.poll(0.02)  # serves the log lines
            return any(f"Topic {name} [0] Leader " in line for line in lines)

        wait_for(answered, timeout=10, what="the metadata answer naming the topic's leader")
        _assigned_with_its_leader(consumer, name, stats)
    finally:
        consumer.close()
