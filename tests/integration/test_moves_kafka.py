"""The move's waits on the source's broker (cronwheel/moves_kafka.py), against
the real broker as its admin: they read consumer groups' committed offsets,
so a group that is behind must hold them, and one the cluster has must be
found. (A client dropped right after list_consumer_groups answered with an
empty list and a "handle destroyed" error, which made every group look
absent: the dispatcher's forwarding was never waited for.)"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from cronwheel import kafka
from cronwheel.kafka import Topics
from cronwheel.moves_kafka import (
    Broker,
    await_applied,
    await_forwarded,
    await_started,
    groups_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def broker(kafka_bootstrap) -> Broker:
    conf = {"bootstrap.servers": kafka_bootstrap, **kafka.security("admin", kafka_bootstrap)}
    return Broker("here", conf)


@pytest.fixture
def topics(broker):
    topics = Topics(f"mk{uuid.uuid4().hex[:8]}")
    yield topics
    admin = broker.admin()
    names = [n for n in admin.list_topics(timeout=10).topics if n.startswith(topics.prefix + ".")]
    if names:
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            fut.result()


def _records(broker: Broker, name: str, per_partition: int, partitions: int = 2) -> None:
    admin = broker.admin()
    if name not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    producer = kafka.producer(broker.conf["bootstrap.servers"], principal="admin")
    for p in range(partitions):
        for _ in range(per_partition):
            producer.produce(name, b"r", partition=p)
    assert producer.flush(30) == 0


def _commit(broker: Broker, group: str, name: str, offsets: list[int]) -> None:
    consumer = kafka.consumer(group, broker.conf["bootstrap.servers"], principal="admin")
    try:
        consumer.commit(
            offsets=[TopicPartition(name, p, o) for p, o in enumerate(offsets)],
            asynchronous=False,
        )
    finally:
        consumer.close()


def test_groups_of__lists_a_group_that_only_committed(broker, topics):
    _records(broker, topics.run_completed, 1)
    _commit(broker, f"{topics.prefix}.workflow", topics.run_completed, [1, 1])
    assert f"{topics.prefix}.workflow" in groups_of(broker.admin())


def test_await_applied__holds_while_the_workflow_group_is_behind__the_end_read_once(broker, topics):
    name, group = topics.run_completed, f"{topics.prefix}.workflow"
    _records(broker, name, 2)
    _commit(broker, group, name, [1, 2])  # one completion not applied yet
    assert await_applied(broker, topics, timeout_s=1.0) is False

    more: list[int] = []

    def meanwhile(seconds: float) -> None:
        # Other tenants' completions arrive while it waits, and the workflow
        # service reaches the end the wait began with: that is enough.
        if not more:
            more.append(1)
            _records(broker, name, 3)
            _commit(broker, group, name, [2, 2])

    assert await_applied(broker, topics, timeout_s=30.0, sleep=meanwhile) is True
    assert more


def test_await_applied__no_workflow_group__nothing_to_wait_for(broker, topics):
    _records(broker, topics.run_completed, 1)
    assert await_applied(broker, topics, timeout_s=1.0) is True


@pytest.mark.parametrize(
    ("wait", "topic", "service"),
    [
        (await_forwarded, "runs", "dispatcher"),  # every run record forwarded to its queue
        (await_started, "webhook", "webhook"),  # every record's run started
        (await_started, "managed", "executor"),
    ],
)
def test_await_tenant_topic__holds_while_the_services_group_is_behind(
    broker, topics, wait, topic, service
):
    tenant = "ten_" + uuid.uuid4().hex[:8]
    name, group = getattr(topics, topic)(tenant), f"{topics.prefix}.{service}"
    _records(broker, name, 2, partitions=1)
    _commit(broker, group, name, [1])
    assert wait(broker, topics, tenant, timeout_s=1.0) is False
    _commit(broker, group, name, [2])
    assert wait(broker, topics, tenant, timeout_s=10.0) is True
