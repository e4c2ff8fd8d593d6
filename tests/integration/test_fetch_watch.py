"""A dispatcher whose consumer holds a partition and does not read it, as
librdkafka left one after a broker restart (cronwheel/fetch_watch.py), ends
its run, a new one with new Kafka clients takes over (run_restarting), and
every run is forwarded once.

The stuck consumer is made by pausing one of its partitions behind the
dispatcher's back: librdkafka then fetches nothing for it, the dispatcher
does not know why, and the broker has records past its position, which is
what the stall after a restart looked like from outside."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from confluent_kafka import TopicPartition

from cronwheel.kafka import Topics
from services.dispatcher.service import Dispatcher
from tests.integration.test_dispatcher import produce, ready
from tests.support.kafka import read_all
from tests.support.running import Restarting, clients_restarted, running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def test_partition_not_read_though_records_wait__new_clients__each_run_forwarded_once(
    database_url, kafka_bootstrap, topic_prefix, caplog
):
    caplog.set_level(logging.WARNING, logger="cronwheel.dispatcher")
    topics = Topics(topic_prefix)
    topic = topics.runs("acme")
    records = {i: (f"r{i}".encode(), ready("acme", f"r{i}")) for i in range(4)}
    # All in partition 0, the one paused below.
    produce(kafka_bootstrap, topic, [records[0], records[1]], partition=0)
    before = clients_restarted("dispatcher")
    made: list[Dispatcher] = []

    def make() -> Dispatcher:
        # No dozing: a dozing partition leaves the assignment and comes back
        # unpaused, which would cure this stuck consumer by itself.
        made.append(
            Dispatcher(database_url, kafka_bootstrap, topics, doze_after_ms=0, fetch_watch_s=1.0)
        )
        return made[-1]

    def forwarded() -> int:
        return sum(d.forwarded_total for d in made)

    with running(Restarting(make)):
        wait_for(lambda: forwarded() >= 2, timeout=60, what="the first two")
        first = made[0]
        first._consumer.pause([TopicPartition(topic, 0)])  # behind its back
        produce(kafka_bootstrap, topic, [records[2], records[3]], partition=0)
        wait_for(lambda: len(made) >= 2, timeout=30, what="new clients")
        wait_for(lambda: forwarded() >= 4, timeout=60, what="the other two")
    assert len(made) == 2 and clients_restarted("dispatcher") - before == 1
    why = [r.getMessage() for r in caplog.records if "Kafka clients are stuck" in r.getMessage()]
    assert len(why) == 1 and f"{topic}[0] at 2" in why[0], why
    queue = topics.queue("acme", "billing")
    forwarded_once = Counter(m.key().decode() for m in read_all(kafka_bootstrap, [queue]))
    assert forwarded_once == {"r0": 1, "r1": 1, "r2": 1, "r3": 1}
