"""A service's nudge topic (cronwheel.fetch_nudge) ends its consumer's
outstanding fetch, so a partition assigned meanwhile is fetched at once
rather than after fetch.wait.max.ms. As the services assign a new topic
(cronwheel.assignment): a nudge before the ask for its leader (waited for,
learn_leaders), the assignment, a nudge after it. Against the real broker,
as the executor's and the webhook service's principals."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import TopicPartition

from cronwheel import kafka
from cronwheel.assignment import (
    FOLLOW_UP_GAP_S,
    FOLLOW_UPS,
    FollowUp,
    learn_leaders,
    until_served,
)
from cronwheel.fetch_nudge import RETRY_S, FetchNudge, ensurer
from cronwheel.kafka import Topics
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration

# Far longer than the test waits for the record: only the nudge can end the
# fetch outstanding before the record arrives.
LONG_FETCH_MS = 30_000


def _consumer(topic_prefix: str, kafka_bootstrap: str, principal: str):
    return kafka.consumer(
        f"{topic_prefix}.{principal}",
        kafka_bootstrap,
        principal=principal,
        **{"fetch.wait.max.ms": LONG_FETCH_MS, "socket.timeout.ms": LONG_FETCH_MS + 30_000},
    )


def _polled(consumer, seconds: float) -> list:
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = consumer.poll(0.1)
        if m is not None and m.error() is None:
            got.append(m)
    return got


@pytest.mark.parametrize("service,kind", [("executor", "managed"), ("webhook", "webhook")])
def test_nudge__a_partition_assigned_while_a_fetch_waits__its_record_read_once_nudged(
    kafka_bootstrap, topic_prefix, service, kind
):
    topics = Topics(topic_prefix)
    first, second = f"{topic_prefix}.{kind}.acme", f"{topic_prefix}.{kind}.globex"
    kafka.ensure_topics([first, second], partitions=1, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal=service)
    writer = kafka.producer(kafka_bootstrap, principal="dispatcher")
    consumer = _consumer(topic_prefix, kafka_bootstrap, service)
    try:
        nudge = FetchNudge(topics.nudge(service), producer, ensurer(kafka_bootstrap, service))
        # A nudge written before the start is not read: read from its end.
        kafka.ensure_topics([nudge.topic], partitions=1, principal=service)
        producer.produce(topic=nudge.topic, value=b"")
        assert producer.flush(10) == 0
        assert nudge.start(consumer)
        consumer.incremental_assign([TopicPartition(first, 0, 0)])
        assert _polled(consumer, 1.0) == []  # nothing anywhere; a fetch now waits

        # Ended, so the ask is answered at once (it would wait behind the
        # fetch); the fetch sent next does not name the new partition.
        # (one nudge before the metadata ask, one before each offsets ask:
        # more than one if the new topic's leader refused the first)
        # A metadata ask that times out on a loaded machine ("no metadata
        # for ... before assigning it") stops the asks after one nudge: the
        # next assignment asks again, and so does this test.
        def learnt() -> bool:
            before = nudge.sent_total
            learn_leaders(consumer, {second}, nudge.nudge)
            return nudge.sent_total - before >= 2

        wait_for(learnt, timeout=30, interval=0, what="the leaders learnt, a nudge before each ask")
        asked = nudge.sent_total
        # The asks' nudges read, so the fetch outstanding is one sent after
        # them: read later, the last could end a fetch after the assignment
        # below, and the one sent next would name the new partition.
        assert not any(m.topic() == second for m in _polled(consumer, 1.0))
        consumer.incremental_assign([TopicPartition(second, 0, 0)])
        writer.produce(topic=second, key=b"run-1", value=b"x")
        assert writer.flush(10) == 0
        # The fetch outstanding does not name the new partition: its record
        # waits (this is what the nudge is for, and that it would wait here).
        got = _polled(consumer, 2.0)
        assert not any(m.topic() == second for m in got)

        assert nudge.nudge() and nudge.sent_total == asked + 1
        wait_for(
            lambda: got.extend(_polled(consumer, 0.2)) or any(m.topic() == second for m in got),
            timeout=10,
            what="the new partition's record, after the nudge",
        )
        assert [m.topic() for m in nudge.drop(got)] == [second]  # the nudges left out
        assert 1 <= sum(nudge.is_nudge(m) for m in got) <= nudge.sent_total  # none from before
    finally:
        consumer.close()


def test_follow_up__the_nudge_ended_a_fetch_before_the_partition_joined__ended_again(
    kafka_bootstrap, topic_prefix
):
    """The race a follow-up is for: the nudge after an assignment is read
    by a fetch that does not name the new partition yet, and the next fetch
    is sent before it does. Made here by assigning only after that nudge was
    read; the record then waits the whole fetch, until the follow-up's nudge."""
    topics = Topics(topic_prefix)
    first, second = f"{topic_prefix}.webhook.acme", f"{topic_prefix}.webhook.globex"
    kafka.ensure_topics([first, second], partitions=1, principal="dispatcher")
    producer = kafka.producer(kafka_bootstrap, principal="webhook")
    writer = kafka.producer(kafka_bootstrap, principal="dispatcher")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "webhook")
    now = [0.0]
    try:
        nudge = FetchNudge(topics.nudge("webhook"), producer, ensurer(kafka_bootstrap, "webhook"))
        assert nudge.start(consumer)
        consumer.incremental_assign([TopicPartition(first, 0, 0)])
        assert _polled(consumer, 1.0) == []  # nothing anywhere; a fetch now waits
        learn_leaders(consumer, {second}, nudge.nudge)
        assert nudge.nudge()  # the nudge "after the assignment", come too early:
        got: list = []
        wait_for(
            lambda: (
                got.extend(_polled(consumer, 0.2))
                or sum(map(nudge.is_nudge, got)) == nudge.sent_total
            ),
            timeout=10,
            what="every nudge read: the fetch outstanding now was sent after them",
        )
        new = [TopicPartition(second, 0, 0)]
        consumer.incremental_assign(new)
        writer.produce(topic=second, key=b"run-1", value=b"x")
        assert writer.flush(10) == 0
        follow = FollowUp(nudge.nudge, clock=lambda: now[0])
        follow.arm(consumer, new)
        assigned = {(second, 0), (first, 0)}
        follow.tick(consumer, assigned)  # too soon
        assert follow.sent == 0
        got = _polled(consumer, 2.0)
        assert not any(m.topic() == second for m in got)  # the record waits

        now[0] += FOLLOW_UP_GAP_S
        follow.tick(consumer, assigned)
        assert follow.sent == 1
        wait_for(
            lambda: got.extend(_polled(consumer, 0.2)) or any(m.topic() == second for m in got),
            timeout=10,
            what="the new partition's record, after the follow-up",
        )
        now[0] += FOLLOW_UP_GAP_S
        follow.tick(consumer, assigned)  # a fetch named it: no more
        now[0] += FOLLOW_UP_GAP_S
        follow.tick(consumer, assigned)
        assert follow.sent == 1
    finally:
        consumer.close()


def test_follow_up__no_fetch_ever_answered__at_most_follow_ups_nudges(
    kafka_bootstrap, topic_prefix
):
    """An end_fetch that ends nothing (a stand-in for nudges that keep coming
    too early): the partition's watermark stays unknown, and the follow-ups
    stop after FOLLOW_UPS; a partition given up meanwhile ends them too."""
    topic = f"{topic_prefix}.webhook.acme"
    kafka.ensure_topics([topic], partitions=1, principal="dispatcher")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "webhook")
    now = [0.0]
    try:
        consumer.poll(0.1)
        new = [TopicPartition(topic, 0, 0)]
        consumer.incremental_assign(new)
        follow = FollowUp(lambda: True, clock=lambda: now[0])
        follow.arm(consumer, new)
        for _ in range(FOLLOW_UPS + 2):
            now[0] += FOLLOW_UP_GAP_S
            follow.tick(consumer, {(topic, 0)})
        assert follow.sent == FOLLOW_UPS
        follow.arm(consumer, new)
        now[0] += FOLLOW_UP_GAP_S
        follow.tick(consumer, set())  # given up before its first fetch
        now[0] += FOLLOW_UP_GAP_S
        follow.tick(consumer, {(topic, 0)})
        assert follow.sent == FOLLOW_UPS
    finally:
        consumer.close()


def test_nudge__a_principal_without_the_topic__no_nudges__tried_again_later__warned_once(
    kafka_bootstrap, topic_prefix, caplog
):
    """The workflow service's principal has no nudge topic: the start fails
    with a warning, nudges are refused, the consumer reads as before; a
    nudge RETRY_S later tries the start again (refused again: no second
    warning)."""
    topics = Topics(topic_prefix)
    producer = kafka.producer(kafka_bootstrap, principal="workflow")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "workflow")
    now = [0.0]
    asked: list[list[str]] = []

    def ensure(names: list[str]) -> None:
        asked.append(names)
        ensurer(kafka_bootstrap, "workflow")(names)

    try:
        nudge = FetchNudge(topics.nudge("executor"), producer, ensure, clock=lambda: now[0])
        with caplog.at_level(logging.WARNING, "cronwheel.fetch_nudge"):
            assert not nudge.start(consumer)
            assert not nudge.nudge() and len(asked) == 1  # too soon to try again
            now[0] += RETRY_S
            assert not nudge.nudge() and len(asked) == 2  # tried, refused again
        assert nudge.sent_total == 0 and consumer.assignment() == []
        warned = [r for r in caplog.records if r.name == "cronwheel.fetch_nudge"]
        assert len(warned) == 1 and "no fetch nudges" in warned[0].getMessage()
    finally:
        consumer.close()


def test_nudge__the_start_failed__started_at_a_nudge_later__nudges_from_then_on(
    kafka_bootstrap, topic_prefix, caplog
):
    """The broker away at the start (here: the first ensure raises): no
    nudges; a nudge RETRY_S later starts it, and is sent."""
    topics = Topics(topic_prefix)
    producer = kafka.producer(kafka_bootstrap, principal="executor")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "executor")
    now = [0.0]
    calls = [0]

    def ensure(names: list[str]) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the broker is away")
        ensurer(kafka_bootstrap, "executor")(names)

    try:
        nudge = FetchNudge(topics.nudge("executor"), producer, ensure, clock=lambda: now[0])
        assert not nudge.start(consumer) and not nudge.nudge()
        now[0] += RETRY_S
        with caplog.at_level(logging.INFO, "cronwheel.fetch_nudge"):
            assert nudge.nudge() and nudge.sent_total == 1 and nudge.active
        assert [tp.topic for tp in consumer.assignment()] == [nudge.topic]
        assert any("from now on" in m for m in caplog.messages)
        got: list = []
        wait_for(
            lambda: got.extend(_polled(consumer, 0.2)) or got,
            timeout=10,
            what="the nudge, read back",
        )
        assert [m.topic() for m in got] == [nudge.topic]
    finally:
        consumer.close()


class _CountedEnds:
    """An end_fetch that ends nothing and counts its calls: one per ask."""

    def __init__(self):
        self.count = 0

    def __call__(self) -> bool:
        self.count += 1
        return True


def test_until_served__a_served_partition_asked_once__a_refused_one_until_the_deadline(
    kafka_bootstrap, topic_prefix
):
    """until_served asks the partitions' offsets, ending the fetch before
    each ask: a partition its leader serves is answered at the first ask
    (once the new topic is served); one that is refused (here: a partition
    the topic does not have) is asked again until the deadline, and the
    loop goes on after it."""
    topic = f"{topic_prefix}.webhook.acme"
    kafka.ensure_topics([topic], partitions=1, principal="dispatcher")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "webhook")
    end_fetch = _CountedEnds()

    try:
        consumer.list_topics(topic, timeout=10)
        # The topic was just made: its leader may refuse the first asks (the
        # very race until_served is for); answered at the last ask it made.
        served = [TopicPartition(topic, 0)]
        t0 = time.monotonic()
        early = until_served(consumer, served, end_fetch, t0 + 10)
        assert end_fetch.count == early + 1 and time.monotonic() - t0 < 10
        assert until_served(consumer, served, end_fetch, time.monotonic() + 10) == 0
        assert end_fetch.count == early + 2  # served now: one ask
        t0 = time.monotonic()
        missing = [TopicPartition(topic, 7)]
        refused = until_served(consumer, missing, end_fetch, t0 + 0.3)
        assert refused >= 1 and end_fetch.count == early + 2 + refused
        assert time.monotonic() - t0 < 5  # bounded by the deadline and one ask's wait
    finally:
        consumer.close()


def test_until_served__the_partitions_of_new_topics_asked_together__one_ask_once_served(
    kafka_bootstrap, topic_prefix
):
    """The executor's topics have a partition per class: all of them, of
    every new topic, are asked in one ask (the loop waits for it), not one
    ask per partition."""
    names = [f"{topic_prefix}.managed.acme", f"{topic_prefix}.managed.globex"]
    kafka.ensure_topics(names, partitions=4, principal="dispatcher")
    consumer = _consumer(topic_prefix, kafka_bootstrap, "executor")
    end_fetch = _CountedEnds()

    try:
        for name in names:
            consumer.list_topics(name, timeout=10)
        served = [TopicPartition(name, p) for name in names for p in range(4)]
        wait_for(
            lambda: until_served(consumer, served, end_fetch, time.monotonic() + 10) == 0,
            timeout=30,
            what="every partition served",
        )
        before = end_fetch.count
        assert until_served(consumer, served, end_fetch, time.monotonic() + 10) == 0
        assert end_fetch.count == before + 1  # eight partitions, one ask
    finally:
        consumer.close()
