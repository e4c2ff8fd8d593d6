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


def worker(bootstrap: str, topic: str, group: str) -> Worker:
    """A worker reading with the dispatcher's credentials (the watchdog is
    about the consumer; nothing is read, so its API is never called)."""
    return Worker(
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
