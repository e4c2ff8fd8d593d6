"""The SDK worker replaces a consumer stuck for good (cronwheel.sdk.watchdog)
and leaves a consumer without partitions alone while its group's coordinator
answers. Against the real broker, with a principal's real credentials: a
group the principal may not read is a coordinator that never gives the
offsets, as after the broker restart that left a worker's consumer out of
its group for good (docs/reliability.md, kafka_restart)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer

from cronwheel import kafka
from cronwheel.sdk.watchdog import ConsumerWatchdog
from cronwheel.sdk.worker import Worker
from tests.support.wait import wait_for

pytestmark = pytest.mark.integration


def quick() -> ConsumerWatchdog:
    return ConsumerWatchdog(empty_for_s=2, ask_every_s=1, replace_gap_s=3)


@contextmanager
def working(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop"


class Watched(Worker):
    """A worker that tells the test whether its consumer holds partitions, and
    takes it out of its group behind the worker's back when asked. Both from
    the worker's own loop (a consumer called from the test's thread while the
    loop polls it did not answer)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.consumers, self.assigned, self.leave = 0, False, threading.Event()

    def _consumer(self, bootstrap: str) -> Consumer:
        self.consumers += 1
        return super()._consumer(bootstrap)

    def _unstick(self, consumer: Consumer) -> Consumer | None:
        if self.leave.is_set():
            self.leave.clear()
            consumer.unsubscribe()
        self.assigned = bool(consumer.assignment())
        return super()._unstick(consumer)


def worker(bootstrap: str, topic: str, group: str) -> Watched:
    """A worker reading with the dispatcher's credentials (the watchdog is
    about the consumer; nothing is read, so its API is never called)."""
    return Watched(
        topic, lambda run: None, api_url="http://127.0.0.1:9", api_key="unused",
        bootstrap=bootstrap, group_id=group, consumer_config=kafka.security("dispatcher", bootstrap),
        follow_every_s=0, drain_seconds=1, watchdog=quick(),
    )  # fmt: skip


@pytest.fixture
def topic(kafka_bootstrap, topic_prefix) -> str:
    name = f"{topic_prefix}.runs.watchdog"
    kafka.ensure_topics([name], partitions=1, bootstrap=kafka_bootstrap, principal="dispatcher")
    return name


def test_worker__coordinator_never_answers__consumer_replaced_with_a_warning(
    kafka_bootstrap, topic_prefix, topic, caplog
):
    if "sasl.username" not in kafka.security("dispatcher", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    caplog.set_level(logging.WARNING, logger="cronwheel.sdk.worker")
    w = worker(kafka_bootstrap, topic, f"{topic_prefix}.not-the-dispatchers")
    with working(w):
        wait_for(lambda: w.watchdog.replaced_total >= 2, timeout=60, what="two replacements")
    replaced = [
        r.getMessage() for r in caplog.records if "replacing the consumer" in r.getMessage()
    ]
    assert len(replaced) >= 2
    assert "the group's coordinator does not answer" in replaced[0]


def test_worker__no_partitions_but_coordinator_answers__consumer_kept(
    kafka_bootstrap, topic_prefix, topic
):
    """Two workers, one partition: one of them has none, and that is fine."""
    group = f"{topic_prefix}.dispatcher-watchdog"  # the dispatcher's group prefix
    a, b = worker(kafka_bootstrap, topic, group), worker(kafka_bootstrap, topic, group)
    with working(a), working(b):
        idle = wait_for(
            lambda: next((w for w in (a, b) if w.watchdog.asked_total >= 3), None),
            timeout=60,
            what="the worker without a partition to ask its coordinator three times",
        )
        assert idle.watchdog.replaced_total == 0
    assert a.watchdog.replaced_total == b.watchdog.replaced_total == 0


def test_worker__out_of_its_group_while_the_coordinator_answers__replaced(
    kafka_bootstrap, topic_prefix, topic, caplog
):
    """The state a CI run left a worker in after a broker restart: no
    partitions, the committed offsets answered, and the group without it.
    Here the worker's consumer leaves the group behind the worker's back."""
    caplog.set_level(logging.WARNING, logger="cronwheel.sdk.worker")
    w = worker(kafka_bootstrap, topic, f"{topic_prefix}.dispatcher-stranded")
    with working(w):
        wait_for(lambda: w.assigned, timeout=60, what="the partition")
        w.leave.set()
        wait_for(lambda: not w.assigned, timeout=60, what="the consumer out of its group")
        wait_for(lambda: w.watchdog.replaced_total >= 1, timeout=60, what="a replacement")
        wait_for(lambda: w.assigned, timeout=60, what="the partition again")
        assert w.consumers == 2
    replaced = [
        r.getMessage() for r in caplog.records if "replacing the consumer" in r.getMessage()
    ]
    assert len(replaced) == 1, replaced
    assert "does not list this consumer among its 0 member(s)" in replaced[0]


class Wedged(Watched):
    """A worker whose first consumer's client cannot talk to the broker (a
    wrong password), while the worker's other clients can: as a consumer
    whose own client librdkafka left wedged after a broker restart."""

    def _consumer(self, bootstrap: str) -> Consumer:
        if self.consumers:
            return super()._consumer(bootstrap)
        good = self.consumer_config
        self.consumer_config = {**good, "sasl.password": "not-the-password"}
        try:
            return super()._consumer(bootstrap)
        finally:
            self.consumer_config = good


def test_worker__broker_answers_another_client_not_its_consumer__replaced(
    kafka_bootstrap, topic_prefix, topic, caplog
):
    if "sasl.username" not in kafka.security("dispatcher", kafka_bootstrap):
        pytest.skip("the broker takes clients without authentication (KAFKA_BOOTSTRAP names one)")
    caplog.set_level(logging.WARNING, logger="cronwheel.sdk.worker")
    w = Wedged(
        topic, lambda run: None, api_url="http://127.0.0.1:9", api_key="unused",
        bootstrap=kafka_bootstrap, group_id=f"{topic_prefix}.dispatcher-wedged",
        consumer_config=kafka.security("dispatcher", kafka_bootstrap),
        follow_every_s=0, drain_seconds=1, watchdog=quick(),
    )  # fmt: skip
    with working(w):
        wait_for(lambda: w.assigned, timeout=90, what="the partition, by a new consumer")
    assert w.consumers == 2
    replaced = [
        r.getMessage() for r in caplog.records if "replacing the consumer" in r.getMessage()
    ]
    assert len(replaced) == 1, replaced
    assert "the broker answers another client and not this consumer" in replaced[0]
