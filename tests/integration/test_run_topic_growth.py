"""A tenant's run topic starts as one partition (one lane, read as normal) and
grows to a partition per class when its first run of another class is
published; the dispatcher then reads every partition. Real broker and
database: outbox -> relay -> run topic -> dispatcher -> queue topic."""

from __future__ import annotations

import psycopg
import pytest

from cronwheel import kafka
from cronwheel.core.runs import PRIORITY_RANK
from cronwheel.kafka import Topics
from cronwheel.store import outbox
from cronwheel.store.jobs import create_tenant
from services.dispatcher.service import Dispatcher
from services.relay.service import Relay
from tests.integration.test_dispatcher import ready
from tests.support.kafka import read_all
from tests.support.running import running
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def topics(topic_prefix) -> Topics:
    return Topics(topic_prefix)


def partitions_of(admin, topic: str) -> int:
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    return len(meta.partitions) if meta is not None and meta.error is None else 0


def test_run_topic__one_lane_until_a_critical_run__grown_to_a_partition_per_class__all_read(
    database_url, kafka_bootstrap, topics
):
    admin = kafka.admin(kafka_bootstrap, principal="observer")
    with psycopg.connect(database_url, autocommit=True) as conn:
        tenant = create_tenant(conn, "growing")["tenant_id"]
        run_topic, queue = topics.runs(tenant), topics.queue(tenant, "billing")

        def publish(run_id: str, priority: str) -> None:
            value = ready(tenant, run_id, priority=priority)
            rank = PRIORITY_RANK[priority]
            outbox.append(
                conn, [outbox.RankedRow(7, run_topic, run_id.encode(), value, priority=rank)]
            )

        with (
            running(Dispatcher(database_url, kafka_bootstrap, topics)) as dispatcher,
            running(Relay(database_url, kafka_bootstrap, idle_ms=100)),
        ):
            wait_for(
                lambda: (run_topic, 0) in dispatcher.assignment.assigned,
                timeout=30,
                what="the new tenant's run topic made and assigned",
            )
            assert partitions_of(admin, run_topic) == kafka.RUN_PARTITIONS == 1

            publish("normal-1", "normal")
            wait_for(lambda: dispatcher.forwarded_total >= 1, timeout=30, what="normal-1")
            assert partitions_of(admin, run_topic) == 1  # a normal run grows nothing

            publish("critical-1", "critical")
            wait_for(
                lambda: (
                    {p for t, p in dispatcher.assignment.assigned if t == run_topic}
                    == set(range(kafka.CLASS_PARTITIONS))
                ),
                timeout=30,
                what="the grown run topic's partitions assigned",
            )
            publish("normal-2", "normal")
            publish("low-1", "low")
            wait_for(lambda: dispatcher.forwarded_total >= 4, timeout=30, what="all four forwarded")

    assert partitions_of(admin, run_topic) == kafka.CLASS_PARTITIONS
    on_run_topic = {m.key().decode(): m.partition() for m in read_all(kafka_bootstrap, [run_topic])}
    assert on_run_topic == {
        "normal-1": 0,  # the one lane, before the topic grew
        "critical-1": 0,  # the critical quarter of four
        "normal-2": 2,
        "low-1": 3,
    }
    assert {m.key().decode() for m in read_all(kafka_bootstrap, [queue])} == set(on_run_topic)
